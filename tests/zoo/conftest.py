"""Session-wide zoo runs: each model is trained once per kind (plain, eager dump, graph
dump, and both dumps with a NaN injected at step 1), whichever check asks first;
every other check reuses the dump.  The wall time of each run is printed at the end.

``transformers`` comes with the test extra (``pip install -e '.[test]'``, which
``scripts/setup.sh`` runs); without it the library models fail with ImportError
rather than being skipped, so that CI cannot silently lose the zoo."""
import pytest

from .runs import ZooRuns

_RUNS = []


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    runs = ZooRuns(lambda name: tmp_path_factory.mktemp(name))
    _RUNS.append(runs)
    return runs


def pytest_terminal_summary(terminalreporter):
    rows = [t for runs in _RUNS for t in runs.timings()]
    if not rows:
        return
    terminalreporter.section("zoo runs (seconds of training, compile included)")
    for name, kind, seconds in sorted(rows):
        terminalreporter.write_line(f"{name:8s} {kind:10s} {seconds:7.1f}")
    terminalreporter.write_line(f"total    {'':10s} {sum(s for _, _, s in rows):7.1f}")
