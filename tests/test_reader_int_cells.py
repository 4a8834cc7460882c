"""The statistics reader's integer columns (task/stream id, timestamp, slot, data size) read
``int(v)`` first where every cell is a plain integer no larger than 2**53 (``float(v)``
exact there), else ``int(float(v))`` as before: the cells and the cell errors are those of
``int(float(v))`` cell by cell, on generated columns mixing integers on both sides of
2**53, decimals, exponents, NaN/inf, signs, spaces, underscores, empty and malformed cells."""
from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opdump.analysis.reader import statistics as S

_ODD = ["1.0", "1e3", "nan", "inf", "-inf", "-0", " 7 ", "+5", "1_000", "00012", "", "x", "1e400",
        "9007199254740992", "9007199254740993", "-9007199254740993", "18446744073709551616", "٣"]
_CELL = st.one_of(st.integers(-(1 << 60), 1 << 60).map(str), st.integers(-(1 << 54), 1 << 54).map(str),
                  st.sampled_from(_ODD))


def _reference(path, col, lines):
    """``int(float(v))`` per cell, -1 and an error where it fails (the reader's rule)."""
    out, errors = [], {}
    for i, v in enumerate(col):
        try:
            out.append(int(float(v)))
        except (ValueError, OverflowError):
            out.append(-1)
            errors.setdefault(i, []).append(S._cell_error(path, lines[i], "Timestamp", v))
    return out, errors


@settings(max_examples=400, deadline=None)
@given(st.lists(_CELL, max_size=12), st.booleans())
def test_int_column_is_int_of_float(cells, plain):
    if plain:                                   # the common case: plain integers only
        cells = [c for c in cells if c.lstrip("-").isdigit()]
    path, lines = Path("statistic.csv"), list(range(2, 2 + len(cells)))
    errors = {}
    got = S._convert_column(path, "Timestamp", "timestamp", tuple(cells), lines, errors)
    want, want_errors = _reference(path, cells, lines)
    assert got == want and all(type(x) is int for x in got)
    assert errors == want_errors


def test_large_integers_round_as_floats():
    big = ["9007199254740993", "1795555515474072"]           # above 2**53: float rounds it
    assert S._convert_column(Path("s.csv"), "Timestamp", "timestamp", tuple(big), [2, 3], {}) == [
        int(float(v)) for v in big]
