"""The compare table's CSV with half of its rows made by a forked child
(opdump/analysis/compare/csv_halves.py): its cases, in ``csv_halves_cases.py``, run in a fresh
pytest process of their own (see ``fresh_pytest.py``)."""
from __future__ import annotations

from fresh_pytest import run_cases_in_fresh_pytest


def test_csv_halves_cases_in_a_fresh_process():
    run_cases_in_fresh_pytest("csv_halves_cases.py")
