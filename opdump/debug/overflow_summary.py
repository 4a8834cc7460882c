"""The per-iteration summary of the overflow-only dump: ``overflow.json`` and ``overflow.csv``
(README, "Debug dumps").

Why two files: the JSON is the whole record (tools read it); the CSV is one row per
overflowing output, for a spreadsheet or ``grep``/``column -s,``.  Both are rendered here
from the same event list, so they always agree, and are written whole by the caller
(temp file + rename).

An event (built by :class:`~.overflow.OverflowWatch`) is a dict ``{"op", "op_type",
"order", "source", "code", "outputs": [{"slot", "dtype", "shape", "nan", "pos_inf",
"neg_inf"}], "dumped"}``.
"""
from __future__ import annotations

import csv
import io
import json
from typing import Dict, Iterable, List, Sequence

#: the header of ``overflow.csv``: one row per overflowing output slot, in execution order
CSV_HEADER = ("Op Name", "Op Type", "Order", "Source", "Code", "Slot", "Data Type", "Shape",
              "NaN Count", "Positive Inf Count", "Negative Inf Count", "Dumped")


def render_json(iteration: int, limit: int, complete: bool, events: Sequence[dict]) -> bytes:
    body = {"iteration": iteration, "overflow_number": limit, "complete": complete, "overflows": list(events)}
    return (json.dumps(body, indent=1) + "\n").encode()


def render_csv(events: Iterable[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_HEADER)
    for e in events:
        for o in e["outputs"]:
            w.writerow((e["op"], e["op_type"], e["order"], e["source"], e["code"], o["slot"], o["dtype"],
                        "(" + ",".join(str(s) for s in o["shape"]) + ")", o["nan"], o["pos_inf"], o["neg_inf"],
                        int(bool(e["dumped"]))))
    return buf.getvalue().encode()


def read_csv(path: str) -> List[Dict[str, str]]:
    """The rows of an ``overflow.csv`` as dicts keyed by :data:`CSV_HEADER` (text cells)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != CSV_HEADER:
        raise ValueError(f"{path}: not an overflow.csv (header {rows[0] if rows else None!r})")
    return [dict(zip(CSV_HEADER, r)) for r in rows[1:]]


def clean_watch(rank_paths: Iterable[str], iterations=None) -> int:
    """How many ``overflow.json`` summaries under these rank folders list no overflow; 0 when
    there is none, or when any one (of the selected ``iterations``) lists an overflow or
    cannot be read.

    Why: an overflow-only dump (``op_debug_mode`` 3) in which nothing overflowed holds no
    tensor file and no statistics row, only these summaries; ``opdump overflow`` then says
    "no NaN/Inf found" (exit 0) from them instead of "nothing to analyse" (exit 2)."""
    import glob
    import os
    wanted = None if iterations is None else {int(i) for i in iterations if not isinstance(i, tuple)}
    clean = 0
    for rank in rank_paths:
        for p in glob.glob(os.path.join(glob.escape(str(rank)), "*", "*", "*", "overflow.json")):
            try:
                with open(p, encoding="utf-8") as f:
                    body = json.load(f)
                it, events = int(body["iteration"]), body["overflows"]
            except Exception:  # noqa: BLE001 - an unreadable summary proves nothing
                return 0
            if wanted is not None and it not in wanted:
                continue
            if events:
                return 0
            clean += 1
    return clean
