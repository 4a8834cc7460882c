"""The compare table's CSV rows made in two halves at once: the second half's fields by a
forked child, which writes them to a file beside the target, the first half's here; the
child's bytes are then appended (:func:`write_rows_in_halves`).

Why: turning 100,000 rows of 34 columns into text is the last serial step of a
statistics-only ``opdump compare`` (~0.2 s of one core) while the second core sits idle.

When (:func:`.open_pair.enabled`, the same rule as the parallel open of the two dumps):
Linux with fork, no other Python thread, and ``OPDUMP_COMPARE_PARALLEL_OPEN=1`` or unset
with an idle CPU and torch not imported; and at least :data:`MIN_ROWS` rows.

Guarantee: the same bytes as making every row here (:mod:`.table_csv`): fields are
per cell, so the halves' fields are the whole table's, and UTF-8 text concatenates as
bytes.  Anything going wrong in the child (a field it does not know, a write error, a
child killed) only costs time: its half is then made here.  The child never returns
into the caller's code (``os._exit``) and is always reaped; its file is always removed.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional

__all__ = ["write_rows_in_halves", "write_slices_in_halves", "MIN_ROWS"]

#: below this many rows the fork costs more than half the rows' text
MIN_ROWS = 20_000

#: how the last call made the second half: "child" or "here" (tests)
last_mode = ""


def rows_text(cols: List[List[str]]) -> str:
    """The rows of ``cols`` (fields column by column) as CSV text, each row ending in ``\\n``."""
    return "\n".join(map(",".join, zip(*cols))) + "\n"


def _child(n: int, h: int, part: str, fields_of: Callable) -> None:
    """In the forked child: write the fields of rows ``h``..``n`` to ``part``, exit (0: written)."""
    code = 1
    try:
        cols = fields_of(h, n)
        if cols is None:
            code = 3
        else:
            with open(part, "w", encoding="utf-8", errors="backslashreplace", newline="") as f:
                f.write(rows_text(cols))
            code = 0
    except BaseException:  # noqa: BLE001 - the parent makes this half itself
        pass
    finally:
        os._exit(code)


def write_rows_in_halves(table, f, fields: Callable) -> Optional[bool]:
    """Write the rows of ``table`` to the open text file ``f`` (after its header), the
    second half made by a forked child when :func:`.open_pair.enabled` and the table has
    :data:`MIN_ROWS` rows or more; ``fields(frame)`` gives a frame's fields column by column,
    or None for a frame it cannot write.  Returns None when it did not apply (nothing
    written), False when ``fields`` refused a half (part of the rows may be written: the
    caller writes the whole table again another way), True when written."""
    return write_slices_in_halves(len(table), f, lambda lo, hi: fields(table.iloc[lo:hi]))


def write_slices_in_halves(n: int, f, fields_of: Callable) -> Optional[bool]:
    """:func:`write_rows_in_halves` of ``n`` rows whose fields ``fields_of(lo, hi)`` gives for
    rows ``lo``..``hi`` (column by column; None: rows it cannot write) -- a table held as
    columns (:mod:`.stat_csv`) needs no frame."""
    global last_mode
    from .open_pair import enabled
    if n < MIN_ROWS or not enabled():
        return None
    h = n // 2
    part = f"{f.name}.rows.{os.getpid()}"
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        _child(n, h, part, fields_of)
    try:
        first = fields_of(0, h)
        if first is None:
            return False
        f.write(rows_text(first))                       # while the child makes the second half
        _, status = os.waitpid(pid, 0)
        pid = 0
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        if code == 3:
            return False                                # the child's half has a field not known here
        if code != 0:
            second = fields_of(h, n)                    # the child failed: this half made here
            if second is None:
                return False
            f.write(rows_text(second))
            last_mode = "here"
            return True
        f.flush()
        with open(part, "rb") as p:
            while True:
                chunk = p.read(1 << 22)
                if not chunk:
                    break
                f.buffer.write(chunk)
        last_mode = "child"
        return True
    finally:
        if pid:
            os.waitpid(pid, 0)                          # an exception here: no child left behind
        try:
            os.unlink(part)
        except OSError:
            pass
