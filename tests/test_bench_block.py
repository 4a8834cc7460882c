"""bench/run.py --block NAME: a partial run (``--models decoder``) writes only its own marked
block of BENCHMARKS.md and keeps the rest; a full rewrite drops such a block once it has
measured that model again.  And the bench's small-kernel decoder builds and trains."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "testdata", "quick_results.json")
RUN = os.path.join(ROOT, "bench", "run.py")


def _run(*args):
    proc = subprocess.run([sys.executable, RUN, "--from-json", RESULTS, *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_block_replaces_only_its_own_section(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    head = "# opdump benchmarks\n\nthe full run's tables\n\n"
    other = "<!-- compare_bench: begin -->\n## compare\n<!-- compare_bench: end -->\n"
    out.write_text(head + "<!-- part: begin -->\nstale numbers\n<!-- part: end -->\n\n" + other)
    _run("--out", str(out), "--block", "part")
    text = out.read_text()
    assert text.startswith(head) and text.endswith(other)
    assert "stale numbers" not in text
    block = text[text.index("<!-- part: begin -->"):text.index("<!-- part: end -->")]
    for needed in ("### alexnet:", "graph statistic device", "Targets of issue 24 item 5",
                   "eager statistic (device) ≤ 1.5× plain eager", "MindStudio Probe", "bench/run.py"):
        assert needed in block, needed
    _run("--out", str(out), "--block", "part")
    assert out.read_text() == text                          # replaced in place, not appended again
    notes = tmp_path / "notes.md"
    notes.write_text("A second reading, one torch thread.\n")
    _run("--out", str(out), "--block", "part", "--notes", str(notes))
    text = out.read_text()
    assert text.index("A second reading, one torch thread.") < text.index("<!-- part: end -->")
    assert text.startswith(head) and text.endswith(other) and text.count("<!-- part: begin -->") == 1


def test_block_is_appended_when_missing(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# opdump benchmarks\n")
    _run("--out", str(out), "--block", "part")
    text = out.read_text()
    assert text.startswith("# opdump benchmarks\n\n<!-- part: begin -->") and text.endswith("<!-- part: end -->\n")


def test_full_rewrite_drops_the_block_of_a_model_it_measured_again(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    kept = "<!-- compare_bench: begin -->\n## compare\n<!-- compare_bench: end -->\n"
    out.write_text("# old\n\n<!-- alexnet: begin -->\nold alexnet block\n<!-- alexnet: end -->\n\n" + kept)
    _run("--out", str(out))
    text = out.read_text()
    assert "old alexnet block" not in text and "<!-- alexnet: begin -->" not in text
    assert text.count(kept) == 1


def test_the_decoder_builds_and_trains_one_step():
    pytest.importorskip("transformers", reason="the bench's decoder is transformers' LlamaForCausalLM "
                                               "(the test extra)")
    sys.path.insert(0, ROOT)
    import torch
    from bench import models as M
    assert "decoder" in M.BUILDERS and {"alexnet", "transformer", "mlp"} <= set(M.BUILDERS)
    w, twin = M.decoder(quick=True), M.decoder(quick=True)
    before = [p.detach().clone() for p in w.model.parameters()]
    for a, b in zip(before, twin.model.parameters()):
        assert torch.equal(a, b)                            # seeded: two builds are identical
    w.step()
    loss = M._lm_loss(w.model(w.x), w.y)
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, p) for a, p in zip(before, w.model.parameters()))
