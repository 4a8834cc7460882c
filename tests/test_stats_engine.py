"""Category table, header, and the host/device split of the StatsEngine."""
import pytest
import torch

from opdump.config.model import ALL_STATISTICS, DEFAULT_STATISTICS, DumpConfig
from opdump.stats import (BASE_HEADER, CATEGORIES, EXTENSIONS, StatsEngine, host_statistics,
                          statistic_header)

COLUMNS = {
    "max": "Max Value", "min": "Min Value", "avg": "Avg Value", "count": "Count",
    "negative zero count": "Negative Zero Count", "positive zero count": "Positive Zero Count",
    "nan count": "NaN Count", "negative inf count": "Negative Inf Count",
    "positive inf count": "Positive Inf Count", "zero count": "Zero Count", "md5": "MD5",
    "l2norm": "L2Norm Value", "finite max": "Finite Max Value", "finite min": "Finite Min Value",
}


def test_table_covers_config_names_and_extensions():
    assert set(CATEGORIES) == set(ALL_STATISTICS) | set(EXTENSIONS)
    assert {n: c.column for n, c in CATEGORIES.items()} == COLUMNS
    assert [n for n, c in CATEGORIES.items() if not c.device_capable] == ["md5"]


def test_header_follows_config_order():
    cats = ["l2norm", "md5", "max", "finite min"]
    assert statistic_header(cats) == [
        "Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size",
        "Data Type", "Shape", "L2Norm Value", "MD5", "Max Value", "Finite Min Value"]
    assert statistic_header(ALL_STATISTICS)[len(BASE_HEADER):] == [
        "Max Value", "Min Value", "Avg Value", "Count", "Negative Zero Count", "Positive Zero Count",
        "NaN Count", "Negative Inf Count", "Positive Inf Count", "Zero Count", "MD5", "L2Norm Value"]


def cfg(**kw):
    return DumpConfig(path="/tmp/x", saved_data="statistic", **kw)


def test_host_mode_computes_everything_on_host():
    # host mode: md5 from the writer's copy; the others when recorded, from the tensor itself
    # (opdump/stats/host_batch.py), with the host semantics
    e = StatsEngine(cfg(statistic_category=("max", "md5", "count")))
    assert e.needs_host_copy and e.fallback_warning() is None
    assert e.host_categories == ("md5",)
    t = torch.tensor([1.0, 2.0, 4.0])
    h = e.device_launch(t)
    dev = e.device_collect()
    host = e.host_cells(t)
    assert e.row_cells(dev[h], host) == host_statistics(t, ["max", "md5", "count"])
    assert e.header() == statistic_header(["max", "md5", "count"])


def test_device_mode_default_categories_need_no_host_copy():
    e = StatsEngine(cfg(stat_calc_mode="device"))
    assert e.categories == DEFAULT_STATISTICS
    assert not e.needs_host_copy and e.fallback_warning() is None
    assert e.host_cells(torch.ones(2)) == {}
    a = e.device_launch(torch.tensor([3.0, -4.0]))
    b = e.device_launch(torch.tensor([1, 2, 3], dtype=torch.int32))
    dev = e.device_collect()
    assert e.row_cells(dev[a], None) == ["3.0", "-4.0", "5.0"]
    assert e.row_cells(dev[b], None) == ["3", "1", host_statistics(torch.tensor([1, 2, 3]), ["l2norm"])[0]]
    # handles restart after a collect
    assert e.device_launch(torch.tensor([7.0])) == 0


def test_device_mode_fallback_for_md5():
    cats = ("md5", "max", "nan count", "avg")
    e = StatsEngine(cfg(stat_calc_mode="device", statistic_category=cats))
    assert e.device_categories == ("max", "nan count", "avg")
    assert e.host_categories == ("md5",)
    assert e.needs_host_copy
    msg = e.fallback_warning()
    assert msg and "'md5'" in msg and "host" in msg
    t = torch.tensor([1.5, float("nan"), 2.5])
    h = e.device_launch(t)
    dev = e.device_collect()
    row = e.row_cells(dev[h], e.host_cells(t))
    assert row == host_statistics(t, cats)


def test_device_and_host_rows_identical_for_exact_categories():
    cats = ("max", "min", "count", "zero count", "negative zero count", "positive zero count",
            "nan count", "negative inf count", "positive inf count", "finite max", "finite min")
    tensors = [torch.tensor([0.1, -0.0, float("inf"), -3.0]), torch.tensor([True, False]),
               torch.arange(-3, 9, dtype=torch.int16).reshape(3, 4), torch.empty(0),
               torch.tensor([0.3, -7.5]).to(torch.bfloat16), torch.tensor(2.0, dtype=torch.float16)]
    dev_engine = StatsEngine(categories=cats, stat_calc_mode="device")
    host_engine = StatsEngine(categories=cats, stat_calc_mode="host")
    handles = [dev_engine.device_launch(t) for t in tensors]
    host_handles = [host_engine.device_launch(t) for t in tensors]
    dev = dev_engine.device_collect()
    host = host_engine.device_collect()
    for t, h, hh in zip(tensors, handles, host_handles):
        assert dev_engine.row_cells(dev[h], None) == host_engine.row_cells(host[hh], host_engine.host_cells(t))
        assert dev_engine.row_cells(dev[h], None) == host_statistics(t, cats)


def test_row_cells_missing_values_are_empty():
    e = StatsEngine(categories=("max", "md5"), stat_calc_mode="device")
    assert e.row_cells(None, None) == ["", ""]
    assert e.row_cells({"max": "1.0"}, None) == ["1.0", ""]


def test_bad_settings():
    with pytest.raises(ValueError):
        StatsEngine(categories=("max",), stat_calc_mode="gpu")
    with pytest.raises(ValueError):
        StatsEngine(categories=("max",), precision="ultra")
    with pytest.raises(ValueError, match="nan count"):
        StatsEngine(categories=("nan cnt",))
