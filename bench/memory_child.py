"""One child process, one mode: peak RSS of a few MLP training steps (``run.py --child-memory``)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import opdump  # noqa: E402
from bench import dumps as D  # noqa: E402
from bench import machine  # noqa: E402
from bench import models as M  # noqa: E402
from bench.modes import MEMORY_QUEUE_MB  # noqa: E402


def child_memory(mode: str, quick: bool, tmp: str) -> None:
    """One process, one mode: peak RSS of a few MLP training steps."""
    w = M.mlp(quick)
    steps = 3
    before = machine.peak_rss_mib()
    d = tempfile.mkdtemp(prefix=f"mem-{mode}-", dir=tmp)
    dump = os.path.join(d, "dump")
    result: Dict[str, Any] = {"mode": mode, "model": w.describe}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode in ("plain-eager", "plain-aot-eager"):
            if mode == "plain-aot-eager":
                w.run_model = torch.compile(w.model, backend="aot_eager")
            for _ in range(steps + 1):
                w.step()
        else:
            saved = {"graph-tensor": "tensor", "eager-tensor": "tensor",
                     "graph-statistic-device": "statistic"}[mode]
            cfg = D.write_config(d, dump, saved_data=saved, stat_calc_mode="device", queue_mb=MEMORY_QUEUE_MB)
            with opdump.Session(cfg) as session:
                if mode.startswith("graph"):
                    w.run_model = torch.compile(w.model, backend=session.backend())
                    for _ in range(steps + 1):
                        w.step()
                else:
                    from opdump.capture.eager import EagerCapture  # type: ignore
                    cap = EagerCapture(session)
                    cap.start()
                    try:
                        for _ in range(steps + 1):
                            w.step()
                    finally:
                        cap.stop()
            result["bytes_written"] = session.writer.bytes_written
            result["writer_errors"] = [repr(e) for e in session.writer.errors[:3]]
            result["steps"] = steps + 1
            files = glob.glob(os.path.join(dump, "**", "*.npy"), recursive=True)
            result["npy_files"] = len(files)
            result["npy_bytes_on_disk"] = sum(os.path.getsize(f) for f in files)
    result["seconds"] = time.perf_counter() - t0
    result["rss_before_mib"] = before
    result["peak_rss_mib"] = machine.peak_rss_mib()
    shutil.rmtree(d, ignore_errors=True)
    print("RESULT " + json.dumps(result), flush=True)
