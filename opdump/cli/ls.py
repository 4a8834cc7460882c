"""``opdump ls``: a dump's summary per rank/graph/iteration, its operators, tensor files or
statistics rows, and the debug modes' findings (exception records, watcher changes).
Exit code 0, 2 on error (an empty dump, a ``--rank``/``--graph``/``--iteration`` the dump does
not hold, or a listing that selects nothing: nothing to analyse; an exception dump in which no
operator raised is a result: "no operator raised", exit 0)."""
from __future__ import annotations

from opdump.analysis.whole_files import replace_whole

from .analysis_commands import _err, _open, _pd_print, count, parse_iterations, unwritable


def _save_csv(df, path: str) -> None:
    """``df`` as CSV at ``path``, written whole (like every analysis output)."""
    replace_whole(path, lambda tmp: df.to_csv(tmp, index=False))


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return str(n)


def _select(df, args, iterations):
    """Rows of ``df`` in the ``--rank``, ``--graph`` and ``--iteration`` the user asked for."""
    if args.rank is not None:
        df = df[df["rank"] == args.rank]
    if args.graph is not None:
        df = df[df["graph"] == args.graph]
    if iterations is not None:
        df = df[df["iteration"].isin(iterations)]
    return df


def _nothing_selected(d, args, iterations, what: str) -> int:
    """Exit 2: the listing or summary the user asked for holds no row (README, "Command line":
    filters that select nothing are never a clean result); the message names the selection."""
    from opdump.analysis.common import nothing_to_analyse
    sel = ([f"rank {args.rank}"] if args.rank is not None else []) + (
        [f"graph {args.graph}"] if args.graph is not None else []) + (
        [f"iterations {sorted(set(iterations))}"] if iterations is not None else [])
    return _err(nothing_to_analyse(d, what + (f" ({', '.join(sel)})" if sel else "")))


def cmd_ls(args) -> int:
    try:
        d = _open(args.path)
    except Exception as e:  # noqa: BLE001 - reported, exit 2
        return _err(str(e))
    try:
        its = parse_iterations(args.iteration)
    except ValueError as e:
        return _err(str(e))
    if args.paths and not args.tensors:
        return _err("--paths lists the tensor files' paths: give it with --tensors")
    from opdump.analysis.common import absent_selection
    absent = absent_selection(d, args.rank, args.graph, its) or unwritable(("--csv", args.csv))
    if absent:
        return _err(absent)
    rec = _select(d.records(), args, its)
    print(f"dump: {d.path}")
    clean_exception_dumps = 0               # ranks whose exception dump recorded no exception
    for rid in d.rank_ids:
        r = d.ranks[rid]
        cfg = r.config or {}
        who = ", ".join(f"{k}={v}" for k, v in cfg.items() if k in ("device_target", "ms_version", "opdump_version",
                                                                      "torch_version", "device_name"))
        saved = (r.data_dump.get("common_dump_settings") or {}).get("saved_data", "tensor") if r.data_dump else None
        field = "saved_data"
        if r.data_dump and isinstance(r.data_dump.get("dump"), dict):     # an ACL/torchair JSON: its own field
            field, saved = "dump_data", r.data_dump["dump"].get("dump_data", "tensor")
        state = {True: "complete", False: "INCOMPLETE", None: "no manifest"}[r.complete]
        if r.complete is False:
            from ..write.manifest import describe as describe_manifest
            state += describe_manifest(r.manifest, str(r.path))
        print(f"rank {rid}: {who or 'no config.json'}; {field}={saved or '?'}; {state}; "
              f"graphs {sorted(r.graphs)}")
        from opdump.debug.exception_records import clean_line, describe as describe_exception, \
            exception_records, is_exception_dump
        records = exception_records(str(r.path))                  # op_debug_mode 4
        for record in records:
            print(f"  {describe_exception(record)}")
        if not records and is_exception_dump(r.manifest, r.data_dump):
            print(f"  {clean_line(r.complete)}")
            clean_exception_dumps += 1
    if d.records().empty and d.ops().empty:          # an empty dump, whatever was asked
        if clean_exception_dumps:
            return 0                                # a clean exception dump: said above, per rank
        return _nothing_selected(d, args, None, "operators, tensor files or statistics rows")
    if not (args.ops or args.tensors or args.stats):
        from opdump.analysis.watcher_report import ls_lines      # watcher mode's findings, one line per iteration
        for line in ls_lines(args.path):
            print(line)
    if args.ops:
        ops = _select(d.ops(), args, None)
        ops = ops.assign(source=[f"{f}:{int(l)}" if isinstance(f, str) and l == l and l is not None else ""
                                 for f, l in zip(ops["file"], ops["line"])])
        cols = ["rank", "graph", "index", "kind", "op_type", "full_name", "source"]
        if ops.empty:
            return _nothing_selected(d, args, None, "operators")
        if args.csv:
            _save_csv(ops, args.csv)
            print(f"wrote {len(ops)} operators to {args.csv}")
        else:
            _pd_print(ops[cols], args.limit)
        return 0
    if args.tensors or args.stats:
        if args.stats:
            df = _select(d.statistics(), args, its)
            cols = [c for c in ["rank", "graph", "iteration", "op", "io", "slot", "dtype", "shape", "max", "min",
                                "avg", "l2norm", "nan_count", "positive_inf_count", "negative_inf_count"]
                    if c in df.columns]
        else:
            df = _select(d.tensors(), args, its)
            cols = ["rank", "graph", "iteration", "op", "io", "slot", "dtype", "shape", "nbytes"] + (
                ["source"] if args.paths else [])      # source: the path, or {bin file}:{io}.{slot}
        if df.empty:
            return _nothing_selected(d, args, its, "statistics rows" if args.stats else "tensor files")
        if args.csv:
            _save_csv(df, args.csv)
            print(f"wrote {len(df)} rows to {args.csv}")
        else:
            _pd_print(df[cols], args.limit)
        return 0
    if rec.empty:
        return _nothing_selected(d, args, its, "tensor files or statistics rows")
    summ = d.summary()
    summ = summ[summ["rank"].isin(set(rec["rank"])) & summ["graph"].isin(set(rec["graph"]))]
    if its is not None:
        summ = summ[summ["iteration"].isin(its)]
    total = int(summ["bytes"].sum())
    summ["size"] = [_human(b) for b in summ["bytes"]]
    if args.csv:
        _save_csv(summ, args.csv)
        print(f"wrote the summary to {args.csv}")
    else:
        _pd_print(summ.drop(columns="bytes"), args.limit)
    print(f"total: {int(summ['tensors'].sum())} tensor files, {_human(total)}")
    return 0


def register_ls(subparsers) -> None:
    """Add ``ls`` to an argparse subparsers object."""
    p = subparsers.add_parser("ls", help="summarise a dump (opdump's or MindSpore's); list ops, tensors, statistics",
                              description="Summary per rank/graph/iteration: operators, tensors, bytes. "
                                          "PATH: the dump root, a rank_N folder, or a folder inside one.")
    p.add_argument("path")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ops", action="store_true", help="list the operators (execution order, source line)")
    g.add_argument("--tensors", action="store_true", help="list the tensor files")
    g.add_argument("--stats", action="store_true", help="list the statistic.csv rows")
    p.add_argument("--rank", type=int)
    p.add_argument("--graph", type=int)
    p.add_argument("--iteration", help="iterations, e.g. 0|5-8")
    p.add_argument("--paths", action="store_true", help="with --tensors: show file paths")
    p.add_argument("--limit", type=count(0), default=200, help="rows to print (default 200)")
    p.add_argument("--csv", help="write the table to this CSV file instead of printing it")
    p.set_defaults(func=cmd_ls)
