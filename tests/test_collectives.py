"""Collective outputs in the eager capture are the values the collective produced (README,
Rank consistency; opdump/capture/eager/collectives.py): two real ranks (torch.distributed,
gloo, one process each), DDP on a small model (its reducer all-reduces the gradient bucket in
the backward pass) and an explicit ``dist.all_reduce(t, async_op=True)`` + ``work.wait()``.

Rank 1 enters the explicit all-reduce only after rank 0's call has returned (a store key),
so on rank 0 the reduction cannot be complete when the call returns: a dump taken then holds
the rank's own input.  The expected values are computed independently of the dump."""
import json
import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import write_config
from dumpfiles import tensor_files

WORLD = 2


def _explicit_input(rank):
    return torch.arange(6, dtype=torch.float32) * (rank + 1) + 0.25


def _worker(rank, world, store_file, cfg, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world)
    import opdump
    from opdump.capture.eager import EagerCapture
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    store = dist.distributed_c10d._get_default_store()
    data = torch.Generator().manual_seed(10 + rank)           # each rank its own batch
    with opdump.Session(cfg) as session, EagerCapture(session):
        model(torch.randn(5, 4, generator=data)).square().sum().backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        t = _explicit_input(rank)
        if rank == 1:
            store.wait(["rank0_returned"])
        work = dist.all_reduce(t, async_op=True)
        if rank == 0:
            store.set("rank0_returned", "1")
        work.wait()
        t.mul_(1.0)                                           # an operator reading the result
        # a third all-reduce that rank 0 does not wait for in this iteration: rank 1 joins only
        # once rank 0's iteration 0 has ended, so it completes in rank 0's next iteration
        u = torch.full((3,), float(rank + 1))
        if rank == 0:
            late = dist.all_reduce(u, async_op=True)
            opt.step()                                        # iteration 0 ends, the work still runs
            store.set("rank0_iteration0_done", "1")
            late.wait()
        else:
            store.wait(["rank0_iteration0_done"])
            dist.all_reduce(u, async_op=True).wait()
            opt.step()
        opt.zero_grad()
    torch.save({"grads": grads, "reduced": t}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)          # no C++ static teardown (see tests/test_distributed.py)


@pytest.fixture(scope="module")
def collective_dump(tmp_path_factory):
    base = tmp_path_factory.mktemp("collectives")
    cfg = write_config(base, common={"iteration": "0"}, extra={"opdump_settings": {"eager_capture": "all"}})
    mp.spawn(_worker, args=(WORLD, str(base / "rendezvous"), cfg, str(base)), nprocs=WORLD, join=True)
    saved = {r: torch.load(base / f"rank{r}.pt") for r in range(WORLD)}
    return base / "dump", saved


def _by_op(files, op_type):
    """{rank: {op_name: {(io, slot): array}}} of one operator type."""
    out = {}
    for f in files:
        if f.op_type == op_type:
            out.setdefault(f.rank, {}).setdefault(f.op_name, {})[(f.io, f.slot)] = f.load()
    return out


def test_allreduce_outputs_are_the_reduced_tensors(collective_dump):
    dump, saved = collective_dump
    ar = _by_op(tensor_files(str(dump)), "allreduce_")
    assert set(ar) == {0, 1}
    names = sorted(ar[0], key=lambda n: int(n.rsplit("-op", 1)[1]))
    assert names == sorted(ar[1], key=lambda n: int(n.rsplit("-op", 1)[1])) and len(names) == 3
    ddp, explicit, late = names                 # DDP's bucket (backward), then the explicit calls
    assert ddp.startswith("Gradients_")           # (file-name form of Gradients/…)
    # the explicit all-reduce: sum over ranks of the inputs, on both ranks
    expected = sum(_explicit_input(r) for r in range(WORLD)).numpy()
    for r in range(WORLD):
        np.testing.assert_array_equal(ar[r][explicit][("input", 0)], _explicit_input(r).numpy())
        np.testing.assert_array_equal(ar[r][explicit][("output", 0)], expected)
        np.testing.assert_array_equal(saved[r]["reduced"].numpy(), expected)
    # DDP's bucket: the sum over ranks of each rank's (pre-divided) bucket, identical on both
    # ranks, holding the averaged gradients the ranks ended up with
    bucket = sum(ar[r][ddp][("input", 0)] for r in range(WORLD))
    assert not np.array_equal(ar[0][ddp][("input", 0)], ar[1][ddp][("input", 0)])
    for r in range(WORLD):
        np.testing.assert_allclose(ar[r][ddp][("output", 0)], bucket, rtol=1e-6, atol=1e-7)
        grads = np.sort(np.concatenate([g.numpy().ravel() for g in saved[r]["grads"]]))
        np.testing.assert_array_equal(np.sort(ar[r][ddp][("output", 0)].ravel()), grads)
    np.testing.assert_array_equal(ar[0][ddp][("output", 0)], ar[1][ddp][("output", 0)])
    # completed after rank 0's iteration 0 had ended: recorded then, in iteration 0's folder
    for r in range(WORLD):
        np.testing.assert_array_equal(ar[r][late][("input", 0)], np.full(3, r + 1, np.float32))
        np.testing.assert_array_equal(ar[r][late][("output", 0)], np.full(3, 3.0, np.float32))


def test_collectives_json_says_complete(collective_dump):
    dump, _ = collective_dump
    docs = sorted(dump.rglob("collectives.json"))
    assert len(docs) == WORLD
    for path in docs:
        doc = json.loads(path.read_text())
        assert doc["iteration"] == 0
        assert [(c["op_type"], c["complete"], c["replicated"], c["group_size"], c["world_size"])
                for c in doc["collectives"]] == [("allreduce_", True, True, 2, 2)] * 3
        # rank 0 ended iteration 0 before its third all-reduce completed: recorded late
        assert [c.get("late", False) for c in doc["collectives"]] == [False, False, doc["rank"] == 0]


def test_rank_check_judges_the_collective_outputs(collective_dump):
    from opdump.analysis.ranks import check_ranks
    dump, _ = collective_dump
    rep = check_ranks(dump, progress=False)
    assert rep.consistent, rep.summary()
    assert rep.collectives == 3            # the three all-reduce outputs were compared, and agree


def test_rank_check_names_a_collective_output_that_differs(collective_dump, tmp_path):
    """The same dump with rank 1's explicit all-reduce output altered on disk: named."""
    import shutil
    from opdump.analysis.ranks import check_ranks
    dump, _ = collective_dump
    copy = tmp_path / "dump"
    shutil.copytree(dump, copy)
    target = max((f for f in tensor_files(str(copy)) if f.rank == 1 and f.op_type == "allreduce_"
                  and f.io == "output"), key=lambda f: int(f.op_name.rsplit("-op", 1)[1]))
    values = target.load()
    values[2] += 1.0
    np.save(target.path, values)
    rep = check_ranks(copy, progress=False)
    assert not rep.consistent
    n = target.op_name.rsplit("-op", 1)[1]
    assert [(d.op, d.io, d.slot) for d in rep.differences] == [(f"Default/allreduce_-op{n}", "output", 0)]


def _graph_worker(rank, world, store_file, cfg):
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world)
    import opdump
    import torch.distributed._functional_collectives as funcol

    class Reduce(torch.nn.Module):
        def forward(self, x):
            return funcol.all_reduce(x * 1.0, "sum", dist.group.WORLD) * 2

    with opdump.Session(cfg) as session:
        compiled = torch.compile(Reduce(), backend=session.backend("eager"))
        compiled(_explicit_input(rank))
        session.step()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_graph_mode_wait_tensor_holds_the_reduced_tensor(tmp_path):
    """Graph mode (functional collectives: ``_c10d_functional.all_reduce`` + ``wait_tensor``):
    the tensor dumped for ``wait_tensor`` is the reduced one, on every rank.  (The
    ``all_reduce`` node's output -- the same buffer, ``wait_tensor``'s input -- is dumped as
    the node returned it: before or after the reduction, by timing; not asserted.)"""
    cfg = write_config(tmp_path, common={"iteration": "0"})
    mp.spawn(_graph_worker, args=(WORLD, str(tmp_path / "rendezvous"), cfg), nprocs=WORLD, join=True)
    expected = sum(_explicit_input(r) for r in range(WORLD)).numpy()
    files = tensor_files(str(tmp_path / "dump"))
    waits = {f.rank: f.load() for f in files if f.op_type == "wait_tensor" and f.io == "output"}
    assert set(waits) == {0, 1}
    for r in range(WORLD):
        np.testing.assert_array_equal(waits[r], expected)
    assert {f.rank for f in files if f.op_type == "all_reduce"} == {0, 1}
    assert not list((tmp_path / "dump").rglob("collectives.json"))     # eager capture only
