"""compare's parallel open streaming B's pickle (opdump/analysis/compare/open_pair.py): its
cases, in ``open_pair_stream_cases.py``, run in a fresh pytest process of their own (see
``fresh_pytest.py``)."""
from __future__ import annotations

from fresh_pytest import run_cases_in_fresh_pytest


def test_open_pair_stream_cases_in_a_fresh_process():
    run_cases_in_fresh_pytest("open_pair_stream_cases.py")
