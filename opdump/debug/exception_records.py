"""Reading back the exception dump's records (``exception.json``, README "Debug dumps") for
``opdump ls``: torch-free, so listing a dump imports no torch.

Guarantees: every ``{net}/{graph}/{iteration}/exception.json`` of a rank folder is found
(folders reached without following links); a file that cannot be read or parsed is
returned as a record with ``"unreadable"`` set to the reason, never raised.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterator, List

from ..format.layout import EXCEPTION_JSON, SPECIAL_DIRS, parse_iteration_dir


def _dirs(path: str) -> Iterator[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            yield e


def exception_files(rank_dir: str) -> List[str]:
    """The ``exception.json`` files of one rank folder, by net, graph and iteration."""
    out = []
    for net in _dirs(rank_dir):
        if net.name in SPECIAL_DIRS:
            continue
        for graph in _dirs(net.path):
            if not graph.name.isdigit():
                continue
            iterations = [e for e in _dirs(graph.path) if isinstance(parse_iteration_dir(e.name), int)]
            for it in sorted(iterations, key=lambda e: int(e.name)):
                path = os.path.join(it.path, EXCEPTION_JSON)
                if os.path.isfile(path) and not os.path.islink(path):
                    out.append(path)
    return out


def exception_records(rank_dir: str) -> List[Dict]:
    """Every operator exception recorded in ``rank_dir``: the JSON records, each with
    ``iteration``, ``graph`` and ``folder`` added (or ``unreadable`` with the reason)."""
    records = []
    for path in exception_files(rank_dir):
        folder = os.path.dirname(path)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read().decode("utf-8"))
            items = doc["exceptions"]
            for rec in items:
                records.append({**rec, "iteration": doc.get("iteration"), "graph": doc.get("graph"),
                                "folder": folder})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            records.append({"folder": folder, "unreadable": f"{path}: {type(exc).__name__}: {exc}"})
    return records


def describe(rec: Dict) -> str:
    """One line for ``opdump ls``."""
    if "unreadable" in rec:
        return f"exception record unreadable: {rec['unreadable']}"
    message = (str(rec.get("message", "")).strip().splitlines() or [""])[0][:200]
    where = f" at {rec['source']}" if rec.get("source") else ""
    return (f"exception: iteration {rec.get('iteration')}, graph {rec.get('graph')}: {rec.get('op')} raised "
            f"{rec.get('exception_type')}: {message}{where}; repro: "
            f"{os.path.join(rec['folder'], str(rec.get('repro')))}")


def is_exception_dump(manifest: Dict, data_dump: Dict) -> bool:
    """Whether a rank folder holds an exception dump (``op_debug_mode`` 4): its manifest's
    ``exceptions`` count, else its copied config's ``op_debug_mode``."""
    if isinstance(manifest, dict) and "exceptions" in manifest:
        return True
    common = data_dump.get("common_dump_settings") if isinstance(data_dump, dict) else None
    try:
        return isinstance(common, dict) and int(common.get("op_debug_mode", 0)) == 4
    except (TypeError, ValueError):
        return False


def clean_line(complete) -> str:
    """``opdump ls``'s line for an exception dump that recorded no exception: a clean run, or
    one still running / killed before its end (``complete`` False) -- not a dump that never
    started (that folder holds no manifest)."""
    if complete is False:
        return "exception dump (op_debug_mode 4): no operator raised so far (the run did not finish)"
    return "exception dump (op_debug_mode 4): no operator raised"
