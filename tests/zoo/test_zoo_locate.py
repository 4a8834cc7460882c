"""Zoo check 4 (issue 17, "The model zoo"): ``locate`` of a line inside a model's
source -- the ``transformers`` file for library models (e.g. ``LlamaMLP.forward``
in ``modeling_llama.py``) -- lists its forward and its backward operators, with
their files in every dumped iteration; the training loop's own line finds the
model's operators too (README "Analysis", locate)."""
import pytest

from opdump.analysis.locate import locate
from opdump.analysis.reader import open_dump

from .models import MODELS

NAMES = sorted(MODELS)


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("name", NAMES)
def test_locate_a_model_source_line(zoo, name, mode):
    run = zoo.get(name, mode)
    file, line = MODELS[name].line()
    hits = locate(open_dump(run.root), f"{file}:{line}")
    names = [h.full_name for h in hits]
    forward = [h for h in hits if h.full_name.startswith("Default/")]
    backward = [h for h in hits if h.full_name.startswith("Gradients/")]
    assert forward, f"no forward operator for {file}:{line}: {names}"
    assert backward, f"no backward operator for {file}:{line}: {names}"
    # a recompiled graph (transformers sets ``config.problem_type`` at the first call) holds the
    # same line again: the union of the hits' files covers every step in which the line ran
    for side, found in (("forward", forward), ("backward", backward)):
        steps = sorted({k for h in found for k, paths in h.files.items() if k is not None and paths})
        assert steps == list(MODELS[name].line_steps), (side, steps, [(h.full_name, h.files) for h in found][:6])
