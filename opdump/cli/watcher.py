"""``opdump watcher DUMP``: what watcher mode found (README, "Debug dumps").

Not to be confused with ``opdump watch`` (watchpoint conditions over any dump).
Exit code: 0 no watched output changed, 1 one changed (the first change is printed
first), 2 error (no ``watcher.json`` below DUMP, or none readable).
"""
from __future__ import annotations

import json
import sys


def cmd_watcher(args) -> int:
    from ..analysis.watcher_report import describe_change, load_watcher
    import os
    if not os.path.exists(args.path):
        print(f"opdump: error: {args.path}: no such file or directory", file=sys.stderr)
        return 2
    found = load_watcher(args.path)
    if not found:
        print(f"opdump: error: no watcher.json below {args.path} (was it dumped with dump_scene \"watcher\" "
              "or e2e_dump_settings.watcher?)", file=sys.stderr)
        return 2
    readable = [it for it in found if "error" not in it.body]
    for it in found:
        if it not in readable:
            print(f"opdump watcher: cannot read {it.path}: {it.body['error']}", file=sys.stderr)
    if not readable:
        return 2
    changed = any(it.first_change for it in readable)
    if args.json:
        doc = [{"path": it.path, **it.body, "snapshot_files": it.snapshot_files} for it in readable]
        print(json.dumps(doc, indent=1))
        return 1 if changed else 0
    for it in readable:
        body = it.body
        state = "" if body.get("complete", True) else " (INCOMPLETE: the watcher stopped)"
        watched = ", ".join(w.get("op", "?") for w in body.get("watched", [])) or "no operator matched"
        print(f"iteration {it.iteration}{state}: watched {watched}")
        first = it.first_change
        print(f"  first change: {describe_change(first)}" if first else "  no watched output changed")
        for change in body.get("changes", [])[1:]:
            print(f"  then: {describe_change(change)}")
        if args.files:
            for snap, files in zip(body.get("snapshots", []), it.snapshot_files):
                after = snap.get("after") or "the iteration's end"
                print(f"  snapshot of {snap.get('watched')} ({snap.get('kind')}, after {after}):")
                for path in files:
                    print(f"    {path}")
    return 1 if changed else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("watcher", help="watcher mode's results: the first operator after which a watched "
                                              "output changed (exit 1 when one did)",
                              description="Reads every watcher.json below PATH (a dump written with dump_scene "
                                          "\"watcher\" / e2e_dump_settings.watcher). Exit code: 0 no watched "
                                          "output changed, 1 one changed, 2 error.")
    p.add_argument("path")
    p.add_argument("--files", action="store_true", help="list each snapshot's tensor files")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_watcher)
