"""The analysis subcommands of the ``opdump`` CLI: ``ls`` (:mod:`.ls`), ``locate``, ``overflow``,
``compare``, ``watch``.  A thin layer over :mod:`opdump.analysis`; the main CLI
calls :func:`register` with its subparsers.  Each command's ``func(args)``
returns the exit code:

* ``ls``: 0, 2 on error (an empty dump, or a selection that selects nothing: nothing to analyse).
* ``locate``: 0 operators found, 1 none, 2 error (an empty dump: nothing to analyse).

``ls``, ``locate``, ``overflow`` and ``watch`` refuse a ``--rank`` (``--graph``, ``--iteration(s)``)
the dump does not hold, naming what it holds (exit 2), before any work.
* ``overflow``: 0 no NaN/Inf found, 1 found, 2 error (nothing to analyse, or no file readable).
* ``compare``: 0 no divergence, 1 a diverging operator or parameter, 2 error (no operator of A
  paired with one of B included: nothing was compared).
* ``watch``: 0 no hit, 1 hits, 2 error.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, List, Optional

__all__ = ["register", "cmd_locate", "cmd_overflow", "cmd_compare", "cmd_watch", "parse_iterations"]


def _err(msg: str) -> int:
    print(f"opdump: error: {msg}", file=sys.stderr)
    return 2


def _report_unreadable(command: str, unreadable) -> None:
    """Each file that could not be read, by path with its reason, on stderr."""
    for path, why in unreadable:
        print(f"opdump {command}: cannot read {path}: {why}", file=sys.stderr)


def _unreadable_json(unreadable):
    return [{"path": p, "reason": r} for p, r in unreadable]


def parse_iterations(text: Optional[str], pairs: bool = False) -> Optional[List[Any]]:
    """``0|5-8`` / ``0,2`` -> [0, 5, 6, 7, 8]; with ``pairs`` (compare), ``3:4`` pairs iteration
    3 of A with 4 of B (elsewhere a pair is a ValueError naming the value)."""
    if text is None or str(text).strip() in ("", "all"):
        return None
    out: List[Any] = []
    for tok in str(text).replace(",", "|").split("|"):
        tok = tok.strip()
        if not tok:
            continue
        if ":" in tok:
            if not pairs:
                raise ValueError(f"iterations {text!r}: {tok!r} is a pair of iterations, which only compare "
                                 "takes (iteration of A:iteration of B); here give iterations, e.g. \"0|5-8\"")
            a, b = tok.split(":", 1)
            out.append((_iteration(a, tok, text), _iteration(b, tok, text)))
        elif "-" in tok[1:]:
            lo, hi = tok.split("-", 1)
            lo_i, hi_i = _iteration(lo, tok, text), _iteration(hi, tok, text)
            if lo_i > hi_i:
                raise ValueError(f"iterations {text!r}: range start {lo_i} is after end {hi_i}")
            out.extend(range(lo_i, hi_i + 1))
        else:
            out.append(_iteration(tok, tok, text))
    return out


def _iteration(word: str, tok: str, text: str) -> int:
    """One iteration number of an ``--iterations`` value; a ValueError naming the value otherwise."""
    try:
        return int(word)
    except ValueError:
        raise ValueError(f"iterations {text!r}: {tok.strip()!r} is not an iteration number, a range (5-8) "
                         "or a pair (3:4); e.g. \"0|5-8\"") from None


def count(least: int):
    """An argparse ``type``: an integer of at least ``least`` (``--limit -1`` printed all but the
    last row and "… 3 more rows", ``--workers -3`` or ``watch --limit 0`` went unnoticed)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{n} is below {least}")
        return n
    parse.__name__ = "count"
    return parse


def _open(path):
    from opdump.analysis.reader import open_dump
    return open_dump(path)


def unwritable(*outputs) -> str:
    """Why an output file option (``("--csv", path)``…) cannot be written, "" when each can:
    checked before the analysis runs, so that a long compare does not end in a traceback (exit 1,
    which reads as "a divergence") for a mistyped folder.  ``-`` (stdout) and None pass."""
    import os
    for option, path in outputs:
        if not path or path == "-":
            continue
        full = os.path.abspath(path)
        parent = os.path.dirname(full)
        if os.path.isdir(full):
            return f"{option} {path}: is a folder"
        if not os.path.isdir(parent):
            return f"{option} {path}: no folder {parent}"
        if not os.access(parent, os.W_OK):
            return f"{option} {path}: folder {parent} is not writable"
    return ""


def _absent(d, rank: Optional[int], iterations: Optional[List[Any]] = None) -> str:
    """A ``--rank`` or ``--iterations`` the dump does not hold: the error naming it and what the
    dump holds (:func:`opdump.analysis.common.absent_selection`), "" when it holds them."""
    from opdump.analysis.common import absent_selection
    return absent_selection(d, rank=rank, iterations=iterations)


def _pd_print(df, limit: Optional[int] = None) -> None:
    import pandas as pd
    if limit is not None and len(df) > limit:
        extra = len(df) - limit
        df = df.head(limit)
    else:
        extra = 0
    with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 250,
                           "display.max_colwidth", 120):
        print(df.to_string(index=False))
    if extra:
        print(f"… {extra} more rows (use --limit or --csv)")


# ----------------------------------------------------------------------------- locate

def cmd_locate(args) -> int:
    from opdump.analysis.locate import locate
    try:
        d = _open(args.path)
    except Exception as e:  # noqa: BLE001
        return _err(str(e))
    if d.ops().empty and d.records().empty:
        from opdump.analysis.common import nothing_to_analyse
        return _err(nothing_to_analyse(d, "operators, tensor files or statistics rows"))
    absent = _absent(d, args.rank)
    if absent:
        return _err(absent)
    hits = locate(d, args.where, rank=args.rank, any_frame=args.any_frame)
    if args.json:
        print(json.dumps([h.to_dict() for h in hits], indent=1))
        return 0 if hits else 1
    if not hits:
        print(f"no operator found for {args.where!r}")
        return 1
    if all(h.match == "stack" for h in hits):
        print("(the line is in these operators' call stacks, not their own innermost line)")
    for h in hits:
        o = h.op
        print(f"{o.full_name}")
        print(f"    type {o.op_type}, {o.kind}, rank {o.rank}, graph {o.graph}"
              + (f", execution order {o.index}" if o.index is not None else ""))
        if h.frame is not None:
            print(f"    source: {h.frame.file}:{h.frame.line}  {h.frame.code}")
        if args.stack and o.sources:
            for fr in o.sources:
                print(f"      at {fr.file}:{fr.line}  {fr.code}")
        for it in sorted(h.files, key=lambda x: (x is None, x if x is not None else 0)):
            from opdump.analysis.reader.bincache import source     # a bin tensor: {bin file}:{io}.{i}
            paths = [source(p) for p in h.files[it]]
            label = "constants" if it is None else f"iteration {it}"
            if args.files:
                print(f"    {label}:")
                for p in paths:
                    print(f"      {p}")
            else:
                import os
                from opdump.analysis.reader import parse_tensor_filename
                names = []
                for p in paths:
                    pt = parse_tensor_filename(os.path.basename(p))
                    names.append(f"{pt['io']}.{pt['slot']}" if pt else os.path.basename(p))
                print(f"    {label}: {', '.join(names)} in {os.path.dirname(paths[0])}")
        for it in sorted(k for k in h.stats if k not in h.files and k is not None):
            print(f"    iteration {it}: {h.stats[it]} rows in statistic.csv")
    print(f"{len(hits)} operator(s)")
    return 0


# ----------------------------------------------------------------------------- overflow

def cmd_overflow(args) -> int:
    from opdump.analysis.overflow import find_overflow, listed_not_dumped
    from .overflow_listed import print_listed, print_listed_only
    try:
        d = _open(args.path)
        its = parse_iterations(args.iterations)
    except Exception as e:  # noqa: BLE001
        return _err(str(e))
    absent = _absent(d, args.rank, its) or unwritable(("--html", args.html))
    if absent:
        return _err(absent)
    rep = find_overflow(d, rank=args.rank, iterations=its, max_affected=args.max_affected,
                        use_tensors=not args.stats_only, progress=not args.quiet)
    _report_unreadable("overflow", rep.unreadable)
    listed = listed_not_dumped(d, rank=args.rank, iterations=its)     # past overflow_number: no files
    if rep.nothing and listed:
        return print_listed_only(listed, args.json, args.max_affected)
    if rep.nothing:
        from opdump.debug.overflow_summary import clean_watch
        clean = clean_watch([r.path for r in d.ranks.values()], its)
        if not clean:
            return _err(rep.nothing)
        if args.json:
            print(json.dumps({"found": False, "origin": None, "affected": [], "more_origins": [], "per_rank": {},
                              "scanned_tensors": 0,
                              "unknown_tensors": 0, "method": "overflow.json", "unreadable": []}, indent=1))
        else:
            print(f"no NaN/Inf found: the overflow watch (op_debug_mode 3) lists no overflowing operator "
                  f"in {clean} iteration folder(s) (overflow.json)")
        return 0
    if not rep.found and rep.unreadable and rep.unknown_tensors >= rep.scanned_tensors:
        return _err(f"nothing could be analysed: all {len(rep.unreadable)} files could not be read")
    if getattr(args, "html", None):         # self-contained report: opdump.analysis.triage_report
        from opdump.analysis.triage_report import write_overflow_html
        print(f"report: {write_overflow_html(d, rep, args.html)}", file=sys.stderr)
    if args.json:
        print(json.dumps({"found": rep.found, "origin": rep.origin.to_dict() if rep.origin else None,
                          "affected": [e.to_dict() for e in rep.affected],
                          "more_origins": [e.to_dict() for e in rep.more_origins],
                          "per_rank": {str(k): (v.to_dict() if v else None) for k, v in rep.per_rank.items()},
                          "scanned_tensors": rep.scanned_tensors, "unknown_tensors": rep.unknown_tensors,
                          "method": rep.method, "unreadable": _unreadable_json(rep.unreadable),
                          "not_dumped": listed}, indent=1))
        return 1 if rep.found or listed else 0
    if rep.unreadable:
        print(f"note: {len(rep.unreadable)} file(s) or statistics rows could not be read (listed on stderr); "
              "the rest was analysed")
    if not rep.found:
        print(f"no NaN/Inf found ({rep.scanned_tensors} floating tensors scanned"
              + (f" from {rep.method}" if rep.method else "") + ")")
        if rep.unknown_tensors:
            print(f"note: {rep.unknown_tensors} tensors could not be checked (statistics without max/min/avg/"
                  "l2norm/NaN/Inf counts and no tensor data)")
        return 0
    o = rep.origin
    what = {"operator": "first operator producing NaN/Inf",
            "argument": "NaN/Inf first brought in by a non-tensor argument of"}.get(
        o.kind, "NaN/Inf first seen in the inputs of")
    print(f"{what}: {o.op}")
    print(f"    type {o.op_type}, iteration {o.iteration}, rank {o.rank}, graph {o.graph}")
    if o.source:
        print(f"    source: {o.source}  {o.code}")
    for t in o.tensors:
        print(f"    {t.describe()}" + (f"  [{t.path}]" if t.path else ""))
    if o.kind == "operator":
        print("    its floating inputs are finite" if o.inputs_checked else "    (its inputs were not dumped)")
    elif o.kind == "argument":
        print("    (a scalar or fill value that is NaN, e.g. x + float('nan'))")
    else:
        print("    (from a parameter, a graph input, or an operator that was not dumped)")
    if rep.affected:
        print("next affected operators:")
        for e in rep.affected:
            print(f"    {e.op}  (iteration {e.iteration}" + (f", {e.source}" if e.source else "") + ")")
    if rep.more_origins:
        print("also overflowed on their own (finite inputs, not affected by the first):")
        for e in rep.more_origins:
            print(f"    {e.op}  (iteration {e.iteration}" + (f", {e.source}" if e.source else "") + ")")
    others = [(k, v) for k, v in rep.per_rank.items() if v is not None and v is not o]
    for k, v in others:
        print(f"rank {k}: first {v.op} (iteration {v.iteration})")
    print_listed(listed, args.max_affected)
    return 1


# ----------------------------------------------------------------------------- compare

def cmd_compare(args) -> int:
    if getattr(args, "ranks", None):        # rank consistency of one dump: opdump.cli.ranks
        if args.a or args.b:
            return _err("compare --ranks DUMP checks one dump's ranks: leave A and B out (or compare A B "
                        "without --ranks)")
        other = [flag for flag, given in (("--rank", args.rank is not None), ("--rank-b", args.rank_b is not None),
                                          ("--mapping", args.mapping), ("--io", args.io),
                                          ("--no-params", args.no_params), ("--html", args.html)) if given]
        if other:                           # they were ignored
            return _err(f"compare --ranks takes --iterations, --workers, --json and -q, not {', '.join(other)}")
        from .ranks import cmd_compare_ranks
        return cmd_compare_ranks(args)
    if not args.a or not args.b:
        return _err("compare needs two dumps A and B (or --ranks DUMP)")
    cannot = unwritable(("--csv", args.csv), ("--html", args.html))
    if cannot:
        return _err(cannot)
    from opdump.analysis.compare import Thresholds, compare
    try:
        its = parse_iterations(args.iterations, pairs=True)
        th = Thresholds(**{k: v for k, v in (("cos_fail", args.cos_fail), ("cos_strict", args.cos_strict),
                                               ("abs_fail", args.abs_fail)) if v is not None})
        res = compare(args.a, args.b, mapping=args.mapping, rank=args.rank, rank_b=args.rank_b,
                      iterations=its, io=args.io, thresholds=th, workers=args.workers,
                      progress=not args.quiet, include_parameters=not args.no_params)
    except Exception as e:  # noqa: BLE001
        return _err(str(e))
    if args.csv and args.csv != "-":
        res.to_csv(args.csv)
    if args.html:
        res.to_html(args.html)
    if args.json:
        print(json.dumps(dict(res.to_dict(), csv=args.csv, html=args.html), indent=1, default=_json_default))
    else:
        print(res.summary())
        if args.csv == "-":
            res.table.to_csv(sys.stdout, index=False)
        if args.show:
            shown = ["iteration", "op", "io", "slot", "verdict", "cosine", "max_abs_err", "reason"]
            t = res.table_columns(shown)        # only these (a statistics compare builds no whole table)
            bad = t[t["verdict"].isin(["diverged", "warning", "nondeterministic"])].head(args.show)
            if len(bad):
                print("first non-passing tensors:")
                _pd_print(bad[shown])
        if args.csv and args.csv != "-":
            print(f"table: {args.csv}")
        if args.html:
            print(f"report: {args.html}")
    nothing = _no_operator_paired(res.operators)
    if nothing:
        return _err(nothing)
    return 1 if res.diverged else 0


def _no_operator_paired(operators) -> str:
    """Why a compare in which both dumps hold operators but none of A's was paired with one of
    B's compared nothing operator by operator ("" when some were): exit 2, not a clean 0 --
    hold-out trial 6 paired a PyTorch dump with a MindSpore one by their parameters only."""
    a, b = operators.get("calls_a", 0), operators.get("calls_b", 0)
    if not a or not b or operators.get("matched_a", 0):
        return ""
    return (f"no operator of A was paired with one of B ({a} in A, {b} in B): nothing was compared operator "
            "by operator. A and B come from different programs, or front ends that name operators "
            "differently (PyTorch and MindSpore: MatMul/BiasAdd vs addmm): pair them with --mapping "
            "FILE (lines 'A_name,B_name')")


def _json_default(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


# ----------------------------------------------------------------------------- watch

def cmd_watch(args) -> int:
    from opdump.analysis.watch import Condition, watch
    try:
        d = _open(args.path)
        conds = [Condition.parse(c) for c in args.cond]
        its = parse_iterations(args.iterations)
    except Exception as e:  # noqa: BLE001
        return _err(str(e))
    if args.op is not None:
        import re
        try:
            re.compile(args.op)
        except re.error as e:               # was a traceback, exit 1 ("hits")
            return _err(f"--op {args.op!r} is not a regular expression: {e}")
    absent = _absent(d, args.rank, its) or unwritable(("--csv", args.csv), ("--html", args.html))
    if absent:
        return _err(absent)
    hits = watch(d, conds, rank=args.rank, iterations=its, op=args.op, io=args.io, target=args.target,
                 progress=not args.quiet, limit=args.limit)
    _report_unreadable("watch", hits.unreadable)
    if hits.nothing:
        return _err(hits.nothing)
    if getattr(args, "html", None):         # self-contained report: opdump.analysis.triage_report
        from opdump.analysis.triage_report import write_watch_html
        print(f"report: {write_watch_html(d, hits, conds, args.html)}", file=sys.stderr)
    if args.csv:                            # written whole, like compare's CSV
        import pandas as pd
        from opdump.analysis.whole_files import replace_whole
        table = pd.DataFrame([h.to_dict() for h in hits])
        replace_whole(args.csv, lambda tmp: table.to_csv(tmp, index=False))
    if args.json:
        print(json.dumps([h.to_dict() for h in hits], indent=1, default=_json_default))
        return 1 if hits else 0
    unread = (f"; {len(hits.unreadable)} file(s) or statistics rows could not be read (listed on stderr)"
              if hits.unreadable else "")
    if not hits:
        print("no hit: " + "; ".join(str(c) for c in conds) + f" ({hits.checked} tensors checked{unread})")
        return 0
    for h in hits:
        where = f"iteration {h.iteration}" if h.iteration is not None else "constants"
        if h.previous_iteration is not None:
            where += f" (vs {h.previous_iteration})"
        print(f"[{h.condition}] {h.op} {h.io}.{h.slot}  {where}, rank {h.rank}: {h.detail}")
    print(f"{len(hits)} hit(s)" + (f"; written to {args.csv}" if args.csv else "") + unread)
    return 1


# ----------------------------------------------------------------------------- register

def register(subparsers) -> None:
    """Add ``locate``, ``overflow``, ``compare``, ``watch`` to an argparse subparsers object."""
    p = subparsers.add_parser("locate", help="operators of a script line (file:line), or an operator's line and files",
                              description="WHERE is FILE:LINE (train.py:175) -> the forward and backward operators of "
                                          "that line and their dump files per iteration; or an operator name (full, "
                                          "file-name form, a dump file name, or a substring) -> its source and files.")
    p.add_argument("path")
    p.add_argument("where")
    p.add_argument("--rank", type=int)
    p.add_argument("--any-frame", action="store_true",
                   help="kept for compatibility: every frame of the operators' stacks is searched")
    p.add_argument("--files", action="store_true", help="print every file path")
    p.add_argument("--stack", action="store_true", help="print every source frame")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_locate)

    p = subparsers.add_parser("overflow", help="the first operator producing NaN/Inf (exit 1 when found)",
                              description="Scan in execution order (statistics when present, tensors otherwise) and "
                                          "name the first operator whose output holds NaN/Inf while its inputs are "
                                          "finite, with its source line and the next affected operators. "
                                          "Exit code: 0 none found, 1 found, 2 error.")
    p.add_argument("path")
    p.add_argument("--rank", type=int)
    p.add_argument("--iterations", help="only these iterations, e.g. 3|5-8")
    p.add_argument("--max-affected", type=count(0), default=5)
    p.add_argument("--stats-only", action="store_true", help="never read tensor data")
    p.add_argument("--html", help="write a self-contained HTML report (NaN/Inf per iteration, trends, origin)")
    p.add_argument("--json", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_overflow)

    p = subparsers.add_parser("compare", help="compare two dumps operator by operator; name the first divergence",
                              description="A is compared against the reference B. Matching: --mapping, then the two "
                                          "execution orders aligned per scope on operator type and tensor "
                                          "signature, then full name. Same dtypes: the first difference is "
                                          "reported; else thresholds decide. Exit code: 0 A and B agree, 1 a "
                                          "difference or divergence, 2 error (nothing to compare). See "
                                          "opdump.analysis.compare for metrics and verdict thresholds.")
    p.add_argument("a", nargs="?")
    p.add_argument("b", nargs="?")
    p.add_argument("--ranks", metavar="DUMP", help="rank consistency of one data-parallel dump: parameters, buffers "
                                                   "and optimizer operators identical on every rank (exit 1 if not)")
    p.add_argument("--mapping", help="file of 'A_name,B_name' lines (optionally NAME:output.0 for single tensors)")
    p.add_argument("--rank", type=int, help="rank to compare (default: all ranks, same ids)")
    p.add_argument("--rank-b", type=int, help="compare --rank of A with this rank of B (e.g. replicas of one dump)")
    p.add_argument("--iterations", help="iterations: 0|5-8, or A:B pairs such as 3:4")
    p.add_argument("--io", choices=["input", "output"], help="compare only inputs or only outputs")
    p.add_argument("--no-params", action="store_true", help="leave Parameter files out")
    p.add_argument("--csv", default="opdump_compare.csv", help="full table as CSV (default opdump_compare.csv; '-' "
                                                               "prints it)")
    p.add_argument("--html", help="write a self-contained HTML report with plots")
    p.add_argument("--workers", type=count(1), help="worker processes (default: the CPUs this process may use, at most 8)")
    p.add_argument("--show", type=count(0), default=10, help="print this many non-passing tensors (default 10)")
    p.add_argument("--cos-fail", type=float, help="diverged when cosine is below this (default 0.9)")
    p.add_argument("--cos-strict", type=float, help="diverged when cosine below this and abs err > 1e-3 (default 0.99)")
    p.add_argument("--abs-fail", type=float, help="diverged when max abs error above this (default 1, scaled)")
    p.add_argument("--json", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser("watch", help="watchpoints over a dump (nan, inf, too_large, all_zero, not_changed, …)",
                              description="Conditions: nan, inf, overflow, too_large:[abs_mean_gt|max_gt|min_gt|"
                                          "mean_gt]=X, too_small:[abs_mean_lt|max_lt|min_lt|mean_lt]=X, "
                                          "all_zero:zero_percentage_ge=P, range:range_start=A,range_end=B,"
                                          "range_percentage_lt=P, not_changed:rtol=R,atol=A, "
                                          "change_too_large:abs_update_ratio_mean_gt=X, "
                                          "change_too_small:abs_update_ratio_mean_lt=X. "
                                          "Exit code: 0 no hit, 1 hits, 2 error.")
    p.add_argument("path")
    p.add_argument("--cond", action="append", required=True, help="a condition (repeatable)")
    p.add_argument("--rank", type=int)
    p.add_argument("--iterations", help="e.g. 0|5-8")
    p.add_argument("--op", help="regular expression on operator / parameter names")
    p.add_argument("--io", choices=["input", "output"])
    p.add_argument("--target", choices=["params", "ops", "all"],
                   help="what to watch (default: params for change conditions, all otherwise)")
    p.add_argument("--limit", type=count(1), help="stop after this many hits")
    p.add_argument("--csv", help="write the hits to this CSV file")
    p.add_argument("--html", help="write a self-contained HTML report (hits, NaN/Inf per iteration, trends)")
    p.add_argument("--json", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_watch)
