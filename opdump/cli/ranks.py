"""``opdump compare --ranks DUMP``: are the replicated tensors of a data-parallel dump identical
on every rank? (:mod:`opdump.analysis.ranks`; README, Analysis: rank consistency).

Exit status: 0 every rank agrees, 1 ranks differ, 2 error (not a dump, fewer than two ranks).
"""
from __future__ import annotations

import json
import sys


def cmd_compare_ranks(args) -> int:
    """Run by ``opdump compare`` when ``--ranks`` is given (``--iterations``, ``--workers``,
    ``--json``, ``-q`` apply)."""
    from ..analysis.ranks import check_ranks
    from .analysis_commands import parse_iterations
    try:
        its = parse_iterations(getattr(args, "iterations", None))
        if its and any(isinstance(i, tuple) for i in its):
            raise ValueError("--ranks compares the same iteration on every rank: give iterations, not A:B pairs")
        rep = check_ranks(args.ranks, iterations=its, workers=getattr(args, "workers", None),
                          progress=not getattr(args, "quiet", False))
    except Exception as e:  # noqa: BLE001 - reported, exit 2
        print(f"opdump: error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(rep.to_dict(), indent=1, default=str))
    else:
        print(rep.summary())
    return 0 if rep.consistent else 1
