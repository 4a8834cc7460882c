"""The run's metadata files in ``.dump_metadata/`` (README, "Output layout"): ``data_dump.json``
(the config as given, or — for a config built in Python — its MindSpore-style JSON, which
loads back to the same config) and ``config.json`` (device, versions, rank).

Written once, when the layout is first used, through the layout's ``write_small`` (whole
files, inside the rank folder)."""
from __future__ import annotations

import json
import os
import platform

import torch

from ..config.model import DumpConfig
from ..format import layout as fmt
from ..version import __version__


def write_run_metadata(layout, cfg: DumpConfig, rank: int) -> None:
    source = cfg.source_bytes if cfg.source_bytes is not None else json.dumps(
        config_as_json(cfg), indent=2).encode()
    layout.write_small(os.path.join(layout.metadata_dir, fmt.DATA_DUMP_JSON), source)
    device = "CPU"
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = "GPU"
    meta = {"device_target": device, "opdump_version": __version__, "torch_version": torch.__version__,
            "python_version": platform.python_version(), "rank": rank}
    if device == "GPU":
        meta["device_name"] = torch.cuda.get_device_name()
    layout.write_small(os.path.join(layout.metadata_dir, fmt.CONFIG_JSON), json.dumps(meta).encode())


def config_as_json(cfg: DumpConfig) -> dict:
    """The MindSpore-style ``data_dump.json`` of a config given as an object."""
    return {
        "common_dump_settings": {
            "op_debug_mode": cfg.op_debug_mode, "dump_mode": cfg.dump_mode, "path": cfg.path,
            "net_name": cfg.net_name, "iteration": str(cfg.iteration), "saved_data": cfg.saved_data,
            "input_output": cfg.input_output, "kernels": list(cfg.kernels),
            "support_device": list(cfg.support_device), "statistic_category": list(cfg.statistic_category),
        },
        "e2e_dump_settings": {"enable": cfg.enable, "trans_flag": cfg.trans_flag,
                              "stat_calc_mode": cfg.stat_calc_mode,
                              "sample_mode": cfg.sample_mode, "sample_num": cfg.sample_num,
                              "save_kernel_args": cfg.save_kernel_args,
                              **({"watcher": {"watcher_nodes": list(cfg.watcher_nodes),
                                              **({"layer": list(cfg.watcher_layer)} if cfg.watcher_layer else {})}}
                                 if cfg.dump_scene == "watcher" else {})},
    }
