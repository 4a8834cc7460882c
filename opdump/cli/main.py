"""``opdump`` entry point: ``run`` (the launcher), ``demo``, and the analysis commands."""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import List, Optional

from ..version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opdump", description="Dump and analyse PyTorch operator data.")
    parser.add_argument("--version", action="version", version=f"opdump {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import run as run_cmd
    run_cmd.register(sub)
    from . import demo as demo_cmd
    demo_cmd.register(sub)
    from .ls import register_ls
    register_ls(sub)
    from . import analysis_commands
    analysis_commands.register(sub)
    from . import triage as triage_cmd
    triage_cmd.register(sub)
    from . import convert as convert_cmd
    convert_cmd.register(sub)
    from . import watcher as watcher_cmd
    watcher_cmd.register(sub)
    return parser


def _safe_streams() -> None:
    """Printing a name never fails: a file name that is not valid UTF-8 (its undecodable
    bytes are surrogates in Python) or a terminal that cannot show a character prints the
    character as a backslash escape instead of raising UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):   # not a TextIOWrapper (captured, closed)
            pass


def main(argv: Optional[List[str]] = None) -> int:
    _safe_streams()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `opdump run` passes everything after the script through untouched.
    if argv and argv[0] == "run":
        from .run import main_run
        return main_run(argv[1:])
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command != "triage":        # triage's runs of the script keep Python's own format
        warnings.formatwarning = _one_line_warning
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as exc:
        # an analysis command's output file or a dump file it could not open: exit 2 (an error),
        # never a traceback's 1, which these commands use for "found" (README, "Command line")
        if args.command in _USER_CODE:
            raise
        print(f"opdump {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # the analysis side imports pandas (an optional dependency) only when it needs it
        if exc.name not in ("pandas", "tqdm"):
            raise
        print(f"opdump {args.command}: needs {exc.name}; pip install 'opdump[analysis]'", file=sys.stderr)
        return 2


#: commands that run the user's code (a script, the demo's training): they leave as Python does
_USER_CODE = frozenset({"run", "demo", "triage"})


def program() -> None:
    """The ``opdump`` command: :func:`main`, then exit with its status.

    Why not plain ``sys.exit``: at exit Python frees every object one by one, and a large
    compare holds a few hundred thousand (its tables): ~0.1 s of a 2 s statistics compare.
    So an analysis command whose work is done -- its output flushed, the ``atexit``
    handlers run (temporary folders removed…), no other thread left -- leaves by
    ``os._exit`` (mypy's ``hard_exit`` does the same).  Commands that run the user's code
    (:data:`_USER_CODE`) and any command with a thread still running exit as Python does."""
    import atexit
    import threading
    code = main()
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command in _USER_CODE or threading.active_count() != 1:
        sys.exit(code)
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:       # noqa: BLE001 - a handler or a closed pipe: Python's own exit then
        sys.exit(code)
    os._exit(code)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """An analysis command's warning as one line for people (Python's default format adds the
    warning's source file and line of opdump's code, which tells a user nothing)."""
    text = str(message)
    return (text if text.startswith("opdump") else f"opdump: warning: {text}") + "\n"


def _closed_pipe() -> int:
    """The reader of our output went away (``opdump ls D | head``): stop quietly, the way
    Python's documentation recommends (signal module, "Note on SIGPIPE") -- what is left
    in stdout's buffer goes to /dev/null, so the flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
