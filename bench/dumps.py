"""The bench's dump configs and dump-folder housekeeping: configs per mode, iteration folders
kept or pruned, arrays read back, the disk synced, the ``numpy.save`` baseline of the same
arrays, and the volume of statistic.csv rows."""
from __future__ import annotations

import glob
import json
import os
import shutil
import time
from typing import Dict, List, Optional

import numpy as np


# --------------------------------------------------------------------------- configs
def write_config(folder: str, dump_path: str, *, iteration: str = "all", saved_data: str = "tensor",
                 stat_calc_mode: Optional[str] = None, queue_mb: Optional[int] = None,
                 extra_e2e: Optional[Dict] = None, op_debug_mode: int = 0) -> str:
    """A MindSpore data_dump.json (the seed's CPU/GPU example) in ``folder`` → its path."""
    cfg = {
        "common_dump_settings": {
            "op_debug_mode": op_debug_mode, "dump_mode": 0, "path": dump_path, "net_name": "Net",
            "iteration": iteration, "saved_data": saved_data, "input_output": 0, "kernels": [],
            "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }
    if stat_calc_mode:
        cfg["e2e_dump_settings"]["stat_calc_mode"] = stat_calc_mode
    if extra_e2e:
        cfg["e2e_dump_settings"].update(extra_e2e)
    if queue_mb:
        cfg["opdump_settings"] = {"writer_queue_mb": queue_mb}
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "data_dump.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


# --------------------------------------------------------------------------- dump folders
def iteration_dirs(dump_path: str) -> Dict[int, List[str]]:
    """iteration → its folders (one per graph id) under ``dump_path``."""
    out: Dict[int, List[str]] = {}
    for d in glob.glob(os.path.join(dump_path, "rank_*", "*", "*", "*")):
        name = os.path.basename(d)
        if name.isdigit() and os.path.isdir(d):
            out.setdefault(int(name), []).append(d)
    return out


def prune_iterations(dump_path: str, keep_last: bool = True) -> None:
    """Delete finished iteration folders (all but the newest when ``keep_last``)."""
    its = iteration_dirs(dump_path)
    if not its:
        return
    newest = max(its)
    for it, dirs in its.items():
        if keep_last and it == newest:
            continue
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def load_iteration_arrays(dump_path: str) -> List[np.ndarray]:
    """Every ``.npy`` of the newest dumped iteration, read into memory."""
    its = iteration_dirs(dump_path)
    if not its:
        return []
    arrays = []
    for d in its[max(its)]:
        for p in sorted(glob.glob(os.path.join(d, "*.npy"))):
            arrays.append(np.load(p, allow_pickle=False))
    return arrays


def sync_disk() -> None:
    """Write dirty pages back, so that timed write phases start from the same page-cache state."""
    try:
        os.sync()
    except AttributeError:  # pragma: no cover - not on Linux
        pass


class NumpySaveBaseline:
    """A plain ``numpy.save`` loop writing ``arrays``, one round after each block of the dump
    it is compared with (so both see the same disk and page-cache state); a round writes
    the arrays ``times`` times, up to an ``os.sync()`` inside its timing."""

    def __init__(self, arrays: List[np.ndarray], folder: str):
        self.arrays = arrays
        self.folder = folder
        self.bytes = 0
        self.seconds = 0.0
        self.files = 0

    def round(self, times: int) -> None:
        sync_disk()
        target = os.path.join(self.folder, f"npsave-{self.files}")
        os.makedirs(target, exist_ok=True)
        t0 = time.perf_counter()
        for k in range(times):
            for i, a in enumerate(self.arrays):
                np.save(os.path.join(target, f"a{k}-{i}.npy"), a, allow_pickle=False)
                self.files += 1
        sync_disk()             # timed: the bytes reach the disk, as the dump's drain makes them
        self.seconds += time.perf_counter() - t0
        self.bytes += sum(a.nbytes for a in self.arrays) * times
        shutil.rmtree(target, ignore_errors=True)

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("nan")


def statistic_volume(dump_path: str) -> Dict[str, float]:
    """Rows and tensor MiB in the statistic.csv files of the newest dumped iteration."""
    import csv
    its = iteration_dirs(dump_path)
    if not its:
        return {}
    rows = 0
    nbytes = 0
    for d in its[max(its)]:
        path = os.path.join(d, "statistic.csv")
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            for rec in csv.DictReader(f):
                rows += 1
                try:
                    nbytes += int(rec.get("Data Size") or 0)
                except ValueError:
                    pass
    return {"stat_rows_per_step": rows, "stat_mib_per_step": nbytes / 2**20}
