"""The model zoo in kernel mode (issue 21: "the model zoo runs in kernel mode"): every zoo
model trained under ``torch.compile`` with ``graph_dump: "kernels"`` (statistics of every
kernel, every step) gives losses bit-identical to the same steps compiled by inductor
without opdump, no fallback warning, and a listing for every graph whose kernels name the
ATen operators they fuse.

Cost: two inductor compiles (forward and backward) per model, about 4 minutes for the
whole zoo on the 2-core machine (all 10 models passed), so this file runs only with
``OPDUMP_ZOO_KERNELS=1`` (the tiny models of tests/test_graph_kernels.py cover the same
checks in every run)."""
import json
import os
import warnings

import pytest
import torch

import opdump

from .models import MODELS

pytestmark = pytest.mark.skipif(os.environ.get("OPDUMP_ZOO_KERNELS") != "1",
                                reason="~4 min of inductor compiles; set OPDUMP_ZOO_KERNELS=1 "
                                       "(tests/test_graph_kernels.py checks the same on tiny models)")

STEPS = 2


def _config(folder) -> str:
    cfg = {"common_dump_settings": {"op_debug_mode": 0, "dump_mode": 0, "path": str(folder / "dump"),
                                    "net_name": "Net", "iteration": "all", "saved_data": "statistic",
                                    "input_output": 0, "kernels": [], "support_device": [0]},
           "e2e_dump_settings": {"enable": True, "trans_flag": True, "stat_calc_mode": "device"},
           "opdump_settings": {"graph_dump": "kernels"}}
    path = folder / "data_dump.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _train(spec, folder=None):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = spec.build()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    batches = [spec.batch(gen) for _ in range(STEPS)]
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = opdump.Session(_config(folder)) if folder is not None else None
        try:
            backend = session.backend("inductor") if session is not None else "inductor"
            forward = torch.compile(model, backend=backend, dynamic=False)
            for step, batch in enumerate(batches):
                if spec.step_attr:
                    model.zoo_step = step
                with torch.autocast("cpu", dtype=torch.bfloat16) if spec.autocast else _null():
                    out = forward(**batch)
                loss = out if isinstance(out, torch.Tensor) else out.loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach().clone())
        finally:
            if session is not None:
                session.close()
    torch._dynamo.reset()
    return losses, [str(w.message) for w in caught if "opdump" in str(w.message)]


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_in_kernel_mode(name, tmp_path):
    spec = MODELS[name]
    dumped, warned = _train(spec, tmp_path)
    plain, _ = _train(spec)
    assert warned == []
    assert [x.float().numpy().tobytes() for x in dumped] == [x.float().numpy().tobytes() for x in plain]
    graphs = tmp_path / "dump" / "rank_0" / "graphs"
    listings = sorted(graphs.glob("*.kernels.json"))
    assert listings
    for path in listings:
        doc = json.loads(path.read_text())
        assert doc["kernels"] and os.path.exists(doc["generated_code"])
        assert any(k["fused_operators"] for k in doc["kernels"]), path
    rows = list((tmp_path / "dump" / "rank_0" / "Net").rglob("statistic.csv"))
    assert rows, "statistics of the kernels were written"
