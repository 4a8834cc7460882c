"""``opdump compare --ranks DUMP``: are the replicated tensors of a data-parallel dump identical
on every rank? (:mod:`opdump.analysis.ranks`; README, Analysis: rank consistency).

Called by ``opdump compare`` (:mod:`.analysis_commands`) when ``--ranks`` is given; it imports
nothing from that module (no import cycle). ``--iterations`` takes the config's grammar
(``0|5-8``, commas allowed) through :func:`opdump.config.iteration.parse_iteration`.

Exit status: 0 every rank agrees, 1 ranks differ, 2 error (not a dump, fewer than two ranks).
"""
from __future__ import annotations

import json
import sys


def cmd_compare_ranks(args) -> int:
    """``--iterations``, ``--workers``, ``--json``, ``-q`` of ``opdump compare`` apply."""
    from ..analysis.ranks import check_ranks
    from ..analysis.reader import open_dump
    from ..config.iteration import parse_iteration
    try:
        dump = open_dump(args.ranks)
        text = getattr(args, "iterations", None)
        its = None
        if text is not None and str(text).strip() not in ("", "all"):
            if ":" in str(text):
                raise ValueError("--ranks compares the same iteration on every rank: give iterations, "
                                 "not A:B pairs")
            spec = parse_iteration(str(text).replace(",", "|"), "--iterations")
            its = [i for i in dump.iterations if i in spec]
        rep = check_ranks(dump, iterations=its, workers=getattr(args, "workers", None),
                          progress=not getattr(args, "quiet", False))
    except Exception as e:  # noqa: BLE001 - reported, exit 2
        print(f"opdump: error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(rep.to_dict(), indent=1, default=str))
    else:
        print(rep.summary())
    return 0 if rep.consistent else 1
