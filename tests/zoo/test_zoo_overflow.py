"""Zoo check 3 (issue 17, "The model zoo"): a NaN injected at step 1 by a forward
hook on a chosen module (:func:`zoo.models.nan_hook`): ``overflow`` names an
operator of that module, at that step, with the hook's line -- in eager and in
graph mode.  Step 0 runs without the injection, so eager's operator sequence
differs between the two dumped iterations (README "Analysis", overflow)."""
import math
import os

import pytest

from opdump.analysis.overflow import find_overflow
from opdump.analysis.reader import open_dump

from .models import MODELS, module_scope, nan_hook_line
from .runs import NAN_STEP

NAMES = sorted(MODELS)


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("name", NAMES)
def test_overflow_names_the_hooked_module_and_line(zoo, name, mode):
    run = zoo.get(name, f"{mode}_nan")
    assert math.isfinite(float(run.losses[0])) and math.isnan(float(run.losses[NAN_STEP])), run.losses
    rep = find_overflow(open_dump(run.root), progress=False)
    assert rep.found
    o = rep.origin
    spec = MODELS[name]
    model = spec.build()
    segment = module_scope(model, spec.nan_module)
    path, line = nan_hook_line()
    where = f"{o.op} ({o.kind}) iteration {o.iteration} at {o.source}"
    assert o.kind == "operator" and o.iteration == NAN_STEP, where
    assert f"/{segment}/" in o.op and o.op.startswith("Default/"), f"expected an operator of {segment}: {where}"
    assert o.source.endswith(f"{os.path.basename(path)}:{line}"), where
