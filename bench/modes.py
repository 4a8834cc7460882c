"""What the bench measures: the dump modes per front-end, their configs and baselines, the
``--quick`` subset, and the eager-capture toggle used around timed blocks."""
from __future__ import annotations

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)




FAR = "1000000000"          # an iteration the run never reaches: nothing selected
MEMORY_QUEUE_MB = 64
BEYOND_RAM_LIMIT_MB = 1024        # the RAM (memory cgroup) given to the 'beyond RAM' runs
MSPROBE_VENV = os.environ.get("OPDUMP_BENCH_MSPROBE_VENV", os.path.join(tempfile.gettempdir(),
                                                                          "opdump-msprobe-venv"))

FLOOR_MODE = "graph floor: aot_eager, op by op, no dump"
EAGER_FLOOR_MODE = "eager floor: a do-nothing dispatch mode, no dump"

GRAPH_MODES = [
    # label, config keywords, baseline ("eager" | "compiled")
    ("graph not-selected", dict(iteration=FAR), "compiled"),
    ("graph statistic host", dict(saved_data="statistic", stat_calc_mode="host"), "eager"),
    ("graph statistic device", dict(saved_data="statistic", stat_calc_mode="device"), "eager"),
    ("graph tensor", dict(saved_data="tensor"), "eager"),
    ("graph full", dict(saved_data="full"), "eager"),
    ("graph overflow watch", dict(op_debug_mode=3), "compiled"),     # bench/overflow_watch.py: more rows
]
EAGER_MODES = [
    ("eager not-selected", dict(iteration=FAR)),
    ("eager statistic host", dict(saved_data="statistic", stat_calc_mode="host")),
    ("eager statistic device", dict(saved_data="statistic", stat_calc_mode="device")),
    ("eager tensor", dict(saved_data="tensor")),
    ("eager overflow watch", dict(op_debug_mode=3)),
]


_T0 = time.perf_counter()


# --quick: every mode on AlexNet, a few on the others (a smoke check of every code path)
QUICK_MODES = {
    "alexnet": None,
    "transformer": {"graph statistic device", "eager statistic device"},
    "mlp": {"graph not-selected", "graph tensor"},
    "decoder": {"graph statistic device", "eager statistic device"},
}


def log(*a) -> None:
    print(f"{time.perf_counter() - _T0:6.1f}s", *a, file=sys.stderr, flush=True)


def eager_capture_class():
    """``opdump.capture.eager.EagerCapture``, or the reason it is not available."""
    try:
        from opdump.capture.eager import EagerCapture  # type: ignore
        return EagerCapture, None
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"


class EagerToggle:
    """Eager capture on around each timed block of the mode, off around the baseline's.

    One ``EagerCapture`` per mode, stopped and started again between blocks, so its
    one-time work (graph id, the listing written on its first dumped iteration) is
    done in the warm-up like a real run's.  ``EagerCapture.start()`` refuses a
    second start; the bench clears its ``_started`` flag to restart it (a bench-only
    workaround: stop() already uninstalled everything).  If that ever fails, a new
    capture is made per block.
    """

    def __init__(self, cls, session):
        self.cls = cls
        self.session = session
        self.cap = None
        self.restarts = 0
        self.fresh = 0

    def enter(self):
        if self.cap is None:
            self.cap = self.cls(self.session)
            self.cap.start()
            self.fresh += 1
            return
        try:
            if getattr(self.cap, "_started", False):
                self.cap._started = False
            self.cap.start()
            self.restarts += 1
        except Exception:  # noqa: BLE001
            self.cap = self.cls(self.session)
            self.cap.start()
            self.fresh += 1

    def exit(self):
        if self.cap is not None:
            self.cap.stop()
