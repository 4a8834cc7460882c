"""``opdump triage [options] -- train.py args…``: run the script twice and name the origin
(:mod:`opdump.analysis.triage`; README, Analysis: triage).

Exit status: 0 nothing found, 1 an origin found and reproduced by run 2, 2 error (bad
config, a run that left no dump), 3 run 2 did not reproduce run 1 (the script is not
deterministic: nothing is reported).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List

from .analysis_commands import count

_DESCRIPTION = ("Run 1 dumps statistics of every operator; the suspects are found (the first NaN/Inf origin, "
                "--cond watchpoint hits, or the first difference against --reference); run 2 dumps whole tensors "
                "of only the suspects (and their inputs' producers) at only the suspect iterations; the report "
                "names the origin, its source line, the files and the command of each run. The script must be "
                "deterministic (seeds, torch.use_deterministic_algorithms). Exit: 0 nothing found, 1 found, "
                "2 error, 3 run 2 did not reproduce run 1.")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="run 1's MindSpore data_dump.json (default: device statistics of every "
                                    "operator, every iteration); its path is replaced by the triage folder")
    p.add_argument("--out", help="the triage folder (default: a fresh ./opdump_triage_<date>_<time>)")
    p.add_argument("--iterations", help="run 1 dumps only these iterations, e.g. 95-105")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cond", action="append", help="suspects are watchpoint hits (repeatable; see opdump watch)")
    g.add_argument("--reference", help="suspects: the first difference from this reference dump (statistics, "
                                       "e.g. run 1 of a triage of the reference program)")
    p.add_argument("--max-suspects", type=count(1), default=5, help="with --cond: at most this many operators")
    p.add_argument("--no-html", action="store_true", help="no triage.html")
    p.add_argument("--show-output", action="store_true", help="echo the script's output (always in runN.log)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages or bars")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- train.py args… (or -m module args…)")


def register(sub) -> None:
    """``triage`` in ``opdump --help``."""
    p = sub.add_parser("triage", help="run a script twice: statistics, then tensors of the suspects only",
                       description=_DESCRIPTION)
    _add_arguments(p)
    p.set_defaults(func=cmd_triage)


def cmd_triage(args) -> int:
    from ..analysis.triage import EXIT_ERROR, TriageError, triage
    from ..config import ConfigError
    script: List[str] = list(args.script or [])
    if script and script[0] == "--":
        script = script[1:]
    if not script:
        print("opdump triage: error: give the script after --: opdump triage -- train.py args…", file=sys.stderr)
        return EXIT_ERROR
    from .run import missing
    why = missing(script[0], script[1] if script[0] == "-m" and len(script) > 1 else None)
    if why:                                 # before run 1: no triage folder for a mistyped name
        print(f"opdump triage: error: {why}", file=sys.stderr)
        return EXIT_ERROR

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"opdump triage: {msg}", file=sys.stderr, flush=True)

    try:
        res = triage(script, config=args.config, folder=args.out, iterations=args.iterations,
                     conditions=args.cond, reference=args.reference, max_suspects=args.max_suspects,
                     html=not args.no_html, progress=not args.quiet, echo=args.show_output, log=say)
    except ConfigError as e:
        print(f"opdump: invalid config: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (TriageError, OSError, ValueError) as e:
        print(f"opdump triage: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(res.to_dict(), indent=1, default=str))
    else:
        print(res.summary())
        if res.html:
            print(f"report: {res.html}")
        print(f"folder: {res.folder}")
    return res.exit_code
