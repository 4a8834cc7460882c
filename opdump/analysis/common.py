"""Helpers shared by overflow, compare and watch: which tensors hold undefined or
random values (README, compare: *skipped*), chunked reading of memory-mapped arrays, and the
finiteness of a tensor from its statistics or its data.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from .reader import is_complex_dtype, is_float_dtype, load_array, npy_header

__all__ = [
    "EMPTY_OPS", "OVERWRITE_OPS", "RANDOM_OPS", "base_op_type", "is_garbage", "is_random_op",
    "iter_chunks", "array_nonfinite", "stats_nonfinite", "is_float_row", "CHUNK_ELEMS",
    "read_error", "stat_errors_of", "stat_problems", "table_stat_problems", "nothing_to_analyse",
    "absent_selection",
]

#: operators whose outputs are uninitialised memory
EMPTY_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    "empty_quantized", "_empty_affine_quantized", "_empty_per_channel_affine_quantized",
})
#: operators that overwrite their first argument wholesale: that input holds garbage
OVERWRITE_OPS = frozenset({
    "uniform_", "normal_", "fill_", "zero_", "zeros_", "copy_", "bernoulli_", "random_",
    "exponential_", "geometric_", "cauchy_", "log_normal_", "set_", "resize_", "_copy_from",
    "copy", "fill", "zero", "_copy_from_and_resize", "uniform",
})
#: random operators: differing outputs are nondeterminism, not divergence (torch + MindSpore names)
RANDOM_OPS = frozenset({
    "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
    "randperm", "normal", "normal_", "uniform", "uniform_", "multinomial", "random_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "poisson", "rrelu", "rrelu_with_noise", "_fused_dropout",
    "native_dropout_backward_random", "_standard_gamma", "binomial", "philox_rand", "seed", "inductor_random",
    "inductor_seeds", "run_and_save_rng_state",
    # MindSpore / Ascend spellings
    "dropoutgenmask", "dropoutdomask", "dropoutgenmaskv3", "statelessdropoutgenmask", "standardnormal",
    "uniformreal", "uniformint", "randomchoicewithmask", "randomcategorical", "randomstandardnormal",
    "randomuniform", "truncatednormal", "randomgamma", "randompoisson", "dropout2d", "dropout3d",
    "dropoutext", "randpermv2", "randint", "randlikeext", "randnlikeext", "randext", "randnext",
})
_OVERLOAD_SUFFIX = re.compile(r"_(default|tensor|scalar|int|float|out|self|memory_format|names|dim|"
                              r"generator|low|like|p|tensor_float|float_tensor|tensor_tensor|from|to)$")
_RANDOM_NOUS = frozenset(x.replace("_", "") for x in RANDOM_OPS)


def base_op_type(op_type: Any) -> str:
    """Normalised operator type, lower case, overload dropped:
    ``fill_.Scalar`` / ``fill__Scalar`` -> ``fill_``; ``DropoutGenMask`` -> ``dropoutgenmask``."""
    t = str(op_type or "")
    if "." in t:            # aten.fill_.Scalar / fill_.Scalar
        parts = [p for p in t.split(".") if p and p != "aten"]
        t = parts[0] if parts else t
    low = t.lower()
    known = EMPTY_OPS | OVERWRITE_OPS | RANDOM_OPS
    if low in known:
        return low
    m = _OVERLOAD_SUFFIX.search(low)
    if m and m.start() > 0 and low[: m.start()] in known:
        return low[: m.start()]
    return low


def is_random_op(op_type: Any) -> bool:
    """Random operators (dropout, bernoulli, rand*, normal, uniform, randperm, multinomial …)."""
    b = base_op_type(op_type)
    return b in RANDOM_OPS or b.replace("_", "") in _RANDOM_NOUS


def is_garbage(op_type: Any, io: str, slot: int) -> bool:
    """Does this tensor hold undefined values (README, compare: *skipped*)? Outputs of
    ``empty*``; the first input (the destination) of wholesale-overwrite operators."""
    b = base_op_type(op_type)
    if io == "output" and b in EMPTY_OPS:
        return True
    if io == "input" and int(slot) == 0 and b in OVERWRITE_OPS:
        return True
    return False


CHUNK_ELEMS = 1 << 22   # 4 Mi elements per chunk: bounded memory on multi-GB tensors


def iter_chunks(a: np.ndarray, chunk: int = CHUNK_ELEMS) -> Iterator[np.ndarray]:
    """Flat chunks of ``a`` (a view of a memory map: only one chunk is in memory at a time)."""
    flat = a.reshape(-1) if a.flags.c_contiguous or a.flags.f_contiguous else np.ascontiguousarray(a).reshape(-1)
    n = flat.size
    for s in range(0, n, chunk):
        yield flat[s: s + chunk]


def _as_real(a: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(a):
        return a.view(a.real.dtype)
    return a


def read_error(exc: BaseException) -> str:
    """The reason a file could not be read, in one line."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else "") or type(exc).__name__


def stat_errors_of(row: Mapping[str, Any]) -> Optional[str]:
    """The malformed-cell report of a statistics row (``stat_errors``, set by
    :func:`opdump.analysis.reader.statistics.read_statistic_csv`), or None when it has none."""
    v = row.get("stat_errors")
    return v if isinstance(v, str) and v else None


def stat_problems(row: Mapping[str, Any]) -> list:
    """What the statistics reader could not read around this row, as ``(path, reason)``:
    its malformed cells (``stat_errors``: the row's statistics are not used) and CSV lines
    of its file the parser refused (``stat_skipped``: the row itself is fine)."""
    out = []
    for key in ("stat_errors", "stat_skipped"):
        v = row.get(key)
        if isinstance(v, str) and v:
            path, sep, rest = v.partition(": line ")
            out.append((path, "line " + rest) if sep else (v, v))
    return out


def table_stat_problems(rec: Any) -> list:
    """:func:`stat_problems` of every row of a records table (before any selection, so that
    a refused line is reported whichever row carries it)."""
    cols = [c for c in ("stat_errors", "stat_skipped") if c in getattr(rec, "columns", ())]
    out: list = []
    if not cols or rec.empty:
        return out
    mask = None
    for c in cols:                   # (Series.map: every pandas version opdump supports)
        m = rec[c].map(lambda v: isinstance(v, str) and bool(v))
        mask = m if mask is None else (mask | m)
    for row in rec.loc[mask, cols].to_dict("records"):
        out.extend(stat_problems(row))
    return out


def nothing_to_analyse(dump: Any, what: str) -> str:
    """The one line saying there was nothing to analyse, and where it looked."""
    ranks = list(getattr(dump, "ranks", {}) or {})
    where = [str(getattr(r, "path", "")) for r in (dump.ranks.values() if ranks else [])]
    looked = ", ".join(where[:4]) + (f" (+{len(where) - 4} more)" if len(where) > 4 else "") if where \
        else str(getattr(dump, "path", "?"))
    return f"nothing to analyse: no {what} in {looked}"


def _few(values: list, most: int = 8) -> str:
    shown = ", ".join(str(v) for v in values[:most])
    return (shown + f", … ({len(values)} in all)" if len(values) > most else shown) or "none"


def absent_selection(dump: Any, rank: Optional[int] = None, graph: Optional[int] = None,
                     iterations: Optional[list] = None) -> str:
    """Why a ``--rank``/``--graph``/``--iteration(s)`` selection cannot select anything: the
    dump holds no such rank, no such graph (in that rank), or none of those iterations --
    one line naming what was asked and what the dump holds ("" when each is there, or the
    dump lists no graphs or iterations to judge by: an empty dump is reported as such).  A
    mistyped filter is an error, not a clean "nothing found" (README, "Command line")."""
    where = getattr(dump, "path", "?")
    if rank is not None and rank not in dump.ranks:
        return f"{where} holds no rank {rank} (its ranks: {_few(dump.rank_ids)})"
    ranks = [dump.ranks[rank]] if rank is not None else list(dump.ranks.values())
    of_rank = f" in rank {rank}" if rank is not None else ""
    if graph is not None:
        graphs = sorted({g for r in ranks for g in r.graphs})
        if graphs and graph not in graphs:
            return f"{where} holds no graph {graph}{of_rank} (its graphs: {_few(graphs)})"
    if iterations is not None:
        asked = sorted({int(i) for i in iterations})
        held = sorted({it.iteration for r in ranks for it in r.iterations
                       if it.iteration is not None and (graph is None or it.graph == graph)})
        if asked and held and not set(asked) & set(held):
            name = "iteration" if len(asked) == 1 else "iterations"
            within = f" in graph {graph}{of_rank.replace(' in ', ' of ')}" if graph is not None else of_rank
            return f"{where} holds no {name} {_few(asked)}{within} (its iterations: {_few(held)})"
    return ""


def array_nonfinite(path_or_array, chunk: int = CHUNK_ELEMS) -> Optional[dict]:
    """Counts of NaN / +Inf / -Inf in a floating array (chunked), and its shape as
    ``statistic.csv`` writes it; None for non-float data.  Give an array loaded with
    :func:`opdump.analysis.reader.npy.load_checked` (header checked against the file size):
    a path is loaded here unchecked (this module cannot import metrics, which imports it)."""
    a = load_array(path_or_array) if isinstance(path_or_array, str) else path_or_array
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)):
        return None
    shape = a.shape
    a = _as_real(a)
    nan = pinf = ninf = 0
    for c in iter_chunks(a, chunk):
        fin = np.isfinite(c)
        if fin.all():
            continue
        bad = c[~fin]
        n = int(np.isnan(bad).sum())
        nan += n
        pinf += int((bad == np.inf).sum())
        ninf += int((bad == -np.inf).sum())
    return {"nan": nan, "pos_inf": pinf, "neg_inf": ninf, "shape": "(" + ", ".join(str(d) for d in shape) + ")"}


def _f(v: Any) -> Optional[float]:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x


def stats_nonfinite(row: Mapping[str, Any]) -> Optional[bool]:
    """From a statistics row: True (holds NaN/Inf), False (finite), None (cannot tell).

    Uses the counts when present (``nan_count``, ``*_inf_count``), otherwise the
    values (``max``, ``min``, ``avg``, ``l2norm`` are NaN/Inf when the tensor holds NaN/Inf)."""
    count = _f(row.get("count"))
    if count == 0 or _f(row.get("data_size")) == 0:
        return False
    counts = [_f(row.get(k)) for k in ("nan_count", "positive_inf_count", "negative_inf_count")]
    known_counts = [c for c in counts if c is not None and not math.isnan(c)]
    if known_counts and any(c > 0 for c in known_counts):
        return True
    have_all_counts = len(known_counts) == 3
    vals = [_f(row.get(k)) for k in ("max", "min", "avg", "l2norm")]
    known = [v for v in vals if v is not None]
    if any(math.isinf(v) for v in known):
        return True
    # a NaN value means NaN data only when the column was computed (non-empty cell)
    if any(math.isnan(v) for v in known):
        if have_all_counts:
            return False
        return True
    if have_all_counts or known:
        return False
    return None


def is_float_row(dtype: Any, path: Any = None, unreadable: Optional[list] = None) -> bool:
    """Floating (or complex) data? From the dtype name, else from the ``.npy`` header.

    A header that cannot be read gives False; with ``unreadable`` (a list) the file is
    appended to it as ``(path, reason)`` so that it is reported, not silently dropped."""
    if isinstance(dtype, str) and dtype:
        return is_float_dtype(dtype) or is_complex_dtype(dtype)
    if isinstance(path, str):
        try:
            dt = npy_header(path)[1]
            return np.issubdtype(dt, np.floating) or np.issubdtype(dt, np.complexfloating)
        except Exception as e:  # noqa: BLE001 - any unreadable header is reported, never raised
            if unreadable is not None:
                unreadable.append((path, f"not a readable .npy header ({read_error(e)})"))
            return False
    return False


def progress_bar(enabled: bool, total: int, desc: str, unit: str):
    """A tqdm bar for long work (None when disabled or tqdm is missing; tqdm hides it off a terminal)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is optional
        return None
    return tqdm(total=total, desc=desc, unit=unit, disable=None, leave=False)
