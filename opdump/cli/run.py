"""``opdump run [--config F] script.py args…``: dump an unmodified training script.

The launcher loads and validates the config *before* the script starts (a bad
config exits with status 2 and one message, no traceback), opens a session,
makes every ``torch.compile`` of the script go through opdump's backend
(wrapping the backend, mode and options the script asked for), starts eager
capture for everything not compiled, runs the script as ``__main__`` with its
own arguments, and closes the session (flushing every file) even when the
script raises.  When the script ends, ``torch.compile``, ``sys.argv`` and
``sys.path`` are as they were before it started.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import runpy
import sys
from typing import Iterator, List, Optional

_DESCRIPTION = "Run SCRIPT with dumping configured by --config or $OPDUMP_CONFIG."


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="data_dump.json (default: $OPDUMP_CONFIG, alias $MINDSPORE_DUMP_CONFIG)")
    p.add_argument("--no-eager", action="store_true", help="dump only torch.compile'd models (graph mode)")
    p.add_argument("-m", dest="module", help="run a module (like python -m) instead of a script")
    p.add_argument("script", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def register(sub) -> None:
    """``run`` in ``opdump --help`` (``opdump run …`` itself is parsed by :func:`_parse`)."""
    _add_arguments(sub.add_parser("run", help="run a training script with dumping on", description=_DESCRIPTION))


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="opdump run", description=_DESCRIPTION)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    if not args.script and not args.module:
        parser.error("a script (or -m module) to run is required")
    return args


@contextlib.contextmanager
def torch_compile_routed(session) -> Iterator[None]:
    """Inside the block, every ``torch.compile`` goes through opdump, keeping the script's own
    backend choices; the original ``torch.compile`` is back when the block ends."""
    import torch

    original = torch.compile

    @functools.wraps(original)
    def compile_with_dump(model=None, *, backend="inductor", mode=None, options=None, dynamic=None, **kwargs):
        if model is None:
            return lambda m: compile_with_dump(m, backend=backend, mode=mode, options=options,
                                               dynamic=dynamic, **kwargs)
        if backend is None or backend == "inductor":
            real = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        elif mode is not None or options is not None:
            real = torch._TorchCompileWrapper(backend, mode, options, dynamic)
        else:
            real = backend
        return original(model, backend=session.backend(real), dynamic=dynamic, **kwargs)

    torch.compile = compile_with_dump
    try:
        yield
    finally:
        if torch.compile is compile_with_dump:      # the script may have replaced it itself
            torch.compile = original


def _divergence_stop(exc: BaseException):
    """``exc`` when it is the online compare's DivergenceStop (README, "Online compare"), else None."""
    if "opdump.debug.online_compare" not in sys.modules:
        return None
    from ..debug.online_compare import DivergenceStop
    return exc if isinstance(exc, DivergenceStop) else None


def _no_module(name: str) -> str:
    """What ``python -m`` says when module ``name`` cannot be found ("" when it can), the
    current folder first on sys.path as there.  Finding ``a.b`` imports the package ``a``."""
    import importlib.util
    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(name) is not None
        why = f"No module named {name}"
    except (ImportError, ValueError) as exc:
        found, why = False, f"Error while finding module specification for {name!r} ({type(exc).__name__}: {exc})"
    finally:
        sys.path.pop(0)
    return "" if found else why


def missing(script: Optional[str], module: Optional[str] = None) -> str:
    """Why the script or module cannot be run (what Python would say), "" when it can be.
    Checked before the session opens (and by ``opdump triage`` before run 1): no traceback of
    opdump's and no dump folder for a mistyped name (a dotted module's own package: its rest
    is checked once the session is open, as finding it imports the package, which python -m
    does after the start as well)."""
    if module:
        return _no_module(module.split(".", 1)[0])
    if os.path.isdir(script):
        if os.path.isfile(os.path.join(script, "__main__.py")):
            return ""
        return f"can't find '__main__' module in {os.path.abspath(script)!r}"
    if not os.path.isfile(script):
        return f"can't open file {os.path.abspath(script)!r}: no such file"
    return ""


def _exit_missing(args: argparse.Namespace, why: str) -> int:
    """Python's message and status: 2 for a script file it cannot open, 1 otherwise."""
    print(f"opdump run: error: {why}", file=sys.stderr)
    return 2 if not args.module and why.startswith("can't open") else 1


def main_run(argv: List[str]) -> int:
    args = _parse(argv)
    why = missing(args.script, args.module)
    if why:
        return _exit_missing(args, why)
    from ..config import ConfigError      # here: the other commands (compare…) never load the config package
    from ..session import Session
    try:
        session = Session(args.config)
    except ConfigError as exc:
        print(f"opdump: invalid config: {exc}", file=sys.stderr)
        return 2
    eager = None
    saved_argv, saved_path = sys.argv, list(sys.path)
    with session, torch_compile_routed(session):
        if not args.no_eager:
            from ..capture.eager import EagerCapture
            eager = EagerCapture(session)
            eager.start()
        try:
            if args.module:
                sys.argv = [args.module, *args.args]
                sys.path.insert(0, os.getcwd())        # as `python -m` does
                why = _no_module(args.module) if "." in args.module else ""
                if why:
                    return _exit_missing(args, why)
                runpy.run_module(args.module, run_name="__main__", alter_sys=True)
            else:
                script = os.path.abspath(args.script)
                sys.argv = [script, *args.args]
                sys.path.insert(0, os.path.dirname(script))
                runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)    # as Python does for sys.exit("message"): shown, status 1
            return code if isinstance(code, int) else (0 if code is None else 1)
        except BaseException as exc:
            stopped = _divergence_stop(exc)             # stop_on_divergence: a clean, early end
            if stopped is None:
                raise
            print(f"opdump: {stopped}", file=sys.stderr)
            from ..debug.online_compare import EXIT_DIVERGED
            return EXIT_DIVERGED
        finally:
            if eager is not None:
                eager.stop()
            sys.argv, sys.path[:] = saved_argv, saved_path
    return 0
