"""Splitting the text of a plain ``statistic.csv`` into its header and columns with a few
string operations over the whole text (:func:`split_columns`), instead of the csv module
row by row.

Why: the csv module spent ~0.2 s of one core on the 100,000 rows of a statistics-only
dump (13 fields a row): one of the largest parts of ``opdump compare`` on such dumps.  A
file MindSpore or opdump writes is plain: one row a line, no field with a line break or
a quote inside, only the shape quoted (``"(32,32)"``).  Splitting the whole text at every
comma once and slicing the columns out is several times faster.

Guarantee: where it returns columns, they are the csv module's fields for that text
(``csv.reader`` with its default dialect): the same strings, row for row.  It returns
None -- and the caller reads the file with the csv module -- for anything it does not
handle exactly: a carriage return, a NUL (or the ``\\x01`` it uses as a separator), a
quote anywhere but around a whole field without quotes or line breaks inside, a row of
another width than the header record (blank lines included), fewer than two lines, a
field longer than the csv module's field size limit (``csv.field_size_limit()``, read at
each call: the csv module refuses such a field, the row-by-row reader reports it).  The
lengths are only measured in a text longer than that limit, the fields only where a line
is (a field is never longer than its line); a quoted field's length is its text between
the quotes, as the csv module counts it.  (Before, any text that long went
to the csv module: every ``statistic.csv`` over 128 KiB, such as the 0.9 MB files of a
MobileBERT dump, whose 40 files a side split in 0.36 s of CPU here against 0.41 s there.)
tests/test_reader_stat_split.py checks the rule against the csv module on generated
texts.
"""
from __future__ import annotations

import csv
from itertools import repeat
from typing import List, Optional, Tuple

__all__ = ["split_columns"]

_COMMA_IN_QUOTES = "\x00"      # commas inside quoted fields while splitting (a NUL sends the file to csv)
_JOIN = "\x01"                 # joins cells to change them in one step
_ENDS = (",", "\n")


def _unquote(text: str) -> Optional[str]:
    """``text`` with every quoted field's quotes taken off and its commas made
    ``_COMMA_IN_QUOTES``, or None when a quote is not around a whole field (after a line
    start or a comma, before a comma, a line end or the text's end) or a quoted field holds
    a line break (the csv module's rules there are not copied)."""
    parts = text.split('"')
    if len(parts) % 2 == 0:
        return None
    inside, outside = parts[1::2], parts[0::2]
    joined = _JOIN.join(inside)
    if "\n" in joined:
        return None
    head, tail, mids = outside[0], outside[-1], outside[1:-1]
    if head and not head.endswith(_ENDS) or tail and not tail.startswith(_ENDS):
        return None
    if not (all(map(str.startswith, mids, repeat(_ENDS))) and all(map(str.endswith, mids, repeat(_ENDS)))):
        return None
    parts[1::2] = joined.replace(",", _COMMA_IN_QUOTES).split(_JOIN)
    return "".join(parts)


def split_columns(text: str, width_of=None) -> Optional[Tuple[List[str], List[Tuple[str, ...]], int]]:
    """(header record, columns, number of rows) of ``text`` split as the csv module splits
    it, or None when the text is not one this function handles exactly (module doc).

    The header record is returned as read (no strip); ``width_of(header)`` gives the number
    of fields every other row must have (default: the header's own); as many columns, each a
    tuple of its cells."""
    if _COMMA_IN_QUOTES in text or _JOIN in text or "\r" in text:
        return None
    limit = csv.field_size_limit()
    long_text = len(text) > limit                  # only then can a field be over the csv module's limit
    ends = text.endswith("\n")                     # before unquoting: a last row '""' is a row
    quoted = '"' in text
    if quoted:
        text = _unquote(text)
        if text is None:
            return None                            # a quote csv reads by rules not copied here
    lines = text.split("\n")
    if ends:
        lines.pop()                                # the last line's end
    if len(lines) < 2 or "" in lines:
        return None                                # a blank line: the csv module gives no field there
    header = lines[0].split(",")
    width = len(header) if width_of is None else width_of(header)
    body = lines[1:]
    n = len(body)
    if width < 1 or set(map(str.count, body, repeat(",", n))) != {width - 1}:
        return None                                # a row of another width, a blank line
    rows = ",".join(body)
    fields = tuple(rows.split(","))
    if long_text and max(map(len, lines)) > limit and max(max(map(len, fields)), max(map(len, header))) > limit:
        return None                                # the csv module refuses that field: it reports it
    cols = [fields[j::width] for j in range(width)]        # tuples (hashable: the reader's memo keys)
    if quoted:
        header = [h.replace(_COMMA_IN_QUOTES, ",") for h in header]
        _requote(cols, rows, width)
    return header, cols, n


def _requote(cols: List[Tuple[str, ...]], rows: str, width: int) -> None:
    """Put the commas of quoted fields back (``_COMMA_IN_QUOTES`` -> ``,``) in the columns
    holding them, in place; ``rows`` the body's fields joined by commas (field k of it is
    row k // width, column k % width).  Columns are looked at from the one holding the first
    such comma on, and only until every one in ``rows`` is found (a file whose one quoted
    column is the shape costs one column's join, not every column's)."""
    left = rows.count(_COMMA_IN_QUOTES)
    if not left:
        return
    first = rows.count(",", 0, rows.index(_COMMA_IN_QUOTES)) % width
    for j in [first] + [j for j in range(width) if j != first]:
        joined = _JOIN.join(cols[j])
        here = joined.count(_COMMA_IN_QUOTES)
        if here:
            cols[j] = tuple(joined.replace(_COMMA_IN_QUOTES, ",").split(_JOIN))
            left -= here
            if not left:
                return
