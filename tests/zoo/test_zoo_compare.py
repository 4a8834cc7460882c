"""Zoo check 2 (issue 17, "The model zoo"): ``compare`` of the eager dump against
the graph dump of the same step: every tensor matched, none diverged -- and, on
CPU, every compared pair bit-equal (README "Design decisions": the dump path runs
operator by operator, bit-identical to eager).

The step compared is step 1 (the second): it runs after an AdamW update, the
transformers classifiers recompile there (they set ``config.problem_type`` at
their first call) and ``BranchNet`` takes its extra branch.  Two tests per model,
so that a failure says which half broke: the verdicts of the pairs compare made,
and whether every tensor found its pair.

Checks that still fail carry an ``xfail`` naming the cause (non-strict: they turn
into XPASS once fixed; then delete the entry)."""
import pytest

from opdump.analysis.compare import compare

from .models import MODELS

NAMES = sorted(MODELS)
STEP = 1
_RESULTS = {}

# what compare pairs wrongly today (model -> cause)
_ACCUMULATE_ORDER = (
    "the AccumulateGrad `detach` of a LayerNorm/BatchNorm weight grad and of its bias grad (same shape, same scope) "
    "run in the other order in the graph run (caught by eager capture around the compiled backward) than in pure "
    "eager; compare pairs equal-signature operators of a scope by occurrence, so weight grad meets bias grad: "
    "'diverged' (opdump/analysis/compare matching; needs a tie-break by data flow or values, or AccumulateGrad ops "
    "named per parameter)")
_DIVERGED_BECAUSE = {"bert": _ACCUMULATE_ORDER, "resnet": _ACCUMULATE_ORDER, "vit": _ACCUMULATE_ORDER}
# why tensors stay unmatched today (model -> cause)
_INPUTS = ("Parameter.inputsK only in the graph dump: graph mode writes the compiled frame's tensor arguments "
           "(capture/graph/backend.py _input_names), eager capture writes only the root's parameters and buffers "
           "(capture/eager/mode.py)")
_CONSTANT = ("eager `lift_fresh` vs graph `lift_fresh_copy` (functionalization) are different op types to compare; "
             "constants/Parameter.data-N has no eager counterpart")
_GRAD_SCOPES = ("in the graph run, eager capture scopes AccumulateGrad `detach` by the owner module's dotted path, "
                "one segment per prefix, never-called ModuleList/ModuleDict included (`layers-ModuleList/0-ViTLayer`, "
                "`layers-ModuleDict/enc:0-Linear`; capture/eager/parameters.py index_parameters), while pure eager "
                "takes the scope its hooks saw: `layers.0-ViTLayer` / `layers.enc:0-Linear`")
_GRAD_ADD = ("backward gradient-sum `add` scoped by the consumer's module in eager (`norm-LlamaRMSNorm/add`) and by "
             "AOT's node meta in graph mode (`Gradients/Default/<Root>/add`)")
_DROPOUT = "dropout(p=0) in training is a `clone` in AOT's graph and no operator in eager"
_UNMATCHED_BECAUSE = {
    "bf16": _INPUTS,
    "hooks": _INPUTS,
    "colon": f"{_INPUTS}; {_GRAD_SCOPES}",
    "const": f"{_INPUTS}; {_CONSTANT}",
    "branch": f"{_INPUTS}; {_GRAD_ADD}",
    "llama": f"{_INPUTS}; {_CONSTANT}; {_GRAD_SCOPES}; {_GRAD_ADD}; eager backward `zeros`; eager dumps buffer "
             "model.rotary_emb.original_inv_freq which the graph does not take as an input",
    "gpt2": f"{_INPUTS}; {_CONSTANT}; {_GRAD_SCOPES}; {_GRAD_ADD}; {_DROPOUT}; transformers' loss_function "
            "breaks the graph (modeling_utils.py loss_function), so the loss frame's operators get scope `Default/` "
            "in graph mode (capture/graph/backend.py _root_class: not a module frame) vs `Default/GPT2LMHeadModel/` "
            "in eager",
    "bert": f"{_INPUTS}; {_GRAD_SCOPES}; {_GRAD_ADD}; {_DROPOUT}; transformers runs other code when compiling: "
            "eager tests attention_mask.all() (`all`, `_local_scalar_dense`) and drops the mask, compiled builds it "
            "(arange, bitwise_and, where, scalar_tensor) and SDPA takes it",
    "vit": f"{_INPUTS}; {_GRAD_SCOPES}; {_GRAD_ADD}; {_DROPOUT}",
    "resnet": f"{_INPUTS}; {_GRAD_SCOPES}; {_GRAD_ADD}; BatchNorm: eager native_batch_norm + add_ + empty vs "
              "graph _native_batch_norm_legit_functional + add + copy_ (functionalization writes the running "
              "stats back): other op types, no pairing rule",
}


def _params(causes):
    return [pytest.param(n, marks=pytest.mark.xfail(reason=causes[n], strict=False)) if n in causes else n
            for n in NAMES]


def _compare(zoo, name):
    """compare(eager dump, graph dump) at step ``STEP``, once per model for both tests."""
    if name not in _RESULTS:
        _RESULTS[name] = compare(zoo.get(name, "eager").root, zoo.get(name, "graph").root, iterations=[STEP],
                                 progress=False, workers=1)
    return _RESULTS[name]


@pytest.mark.parametrize("name", _params(_DIVERGED_BECAUSE))
def test_eager_vs_graph_none_diverged_values_bit_equal(zoo, name):
    r = _compare(zoo, name)
    t = r.table
    summary = r.summary()
    assert len(t) and set(t["iteration"].dropna()) == {STEP}, summary
    diverged = t[t["verdict"] == "diverged"]
    assert diverged.empty, f"{summary}\n" + diverged[["op", "op_b", "io", "slot", "reason"]].head(12).to_string()
    assert r.first_divergence is None and not r.diverged_parameters, summary
    compared = t[~t["verdict"].isin(["skipped", "unmatched"])]
    not_equal = compared[compared["max_abs_err"].fillna(0) != 0]
    assert not_equal.empty, not_equal[["op", "op_b", "io", "slot", "max_abs_err"]].head(12).to_string()


@pytest.mark.parametrize("name", _params(_UNMATCHED_BECAUSE))
def test_eager_vs_graph_every_tensor_matched(zoo, name):
    r = _compare(zoo, name)
    t = r.table
    unmatched = t[t["verdict"] == "unmatched"]
    assert not r.unmatched_a and not r.unmatched_b and unmatched.empty, (
        f"{r.summary()}\nonly in eager: {r.unmatched_a[:12]}\nonly in graph: {r.unmatched_b[:12]}")
