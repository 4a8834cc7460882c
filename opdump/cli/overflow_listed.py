"""``opdump overflow``: the overflow watch's entries past ``overflow_number`` (README, Debug dumps).

Why: an overflow-only dump (``op_debug_mode`` 3) dumps the first ``overflow_number``
overflowing operators and lists the later ones in ``overflow.json`` only; they have no file,
so the scan of tensors cannot show them.  They are printed after the report (and as
``not_dumped`` in ``--json``), and a selection whose overflows were all past the limit is an
overflow found (exit 1), not "nothing to analyse".
"""
from __future__ import annotations

import json


def print_listed(listed, limit: int) -> None:
    """The overflow watch's entries past ``overflow_number`` (listed in overflow.json, no files)."""
    from opdump.analysis.overflow import describe_listed
    if not listed:
        return
    print(f"{len(listed)} more overflowing operator(s) listed in overflow.json but not dumped "
          "(past overflow_number):")
    for e in listed[:max(limit, 1)]:
        print(f"    {describe_listed(e)}")
    if len(listed) > max(limit, 1):
        print(f"    ... ({len(listed) - max(limit, 1)} more; --json lists them all)")


def print_listed_only(listed, as_json: bool, limit: int) -> int:
    """No tensor file in the selection, but overflow.json lists overflows past the limit: they
    are overflows all the same (exit 1), not "nothing to analyse"."""
    if as_json:
        print(json.dumps({"found": True, "origin": None, "affected": [], "more_origins": [], "per_rank": {},
                          "scanned_tensors": 0, "unknown_tensors": 0, "method": "overflow.json",
                          "unreadable": [], "not_dumped": listed}, indent=1))
        return 1
    print("no tensor of these iterations was dumped (overflow_number reached earlier), but the overflow "
          "watch lists overflowing operators:")
    print_listed(listed, limit)
    return 1
