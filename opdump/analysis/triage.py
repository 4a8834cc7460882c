"""``opdump triage``: from a symptom to the operator, its line and its tensors, in one
command (README, Analysis: triage).

1. Run 1 runs the script through the launcher (``python -m opdump run``, a real
   subprocess) with a statistics dump (:mod:`.triage_config`).
2. The suspects are found in run 1's dump (:mod:`.triage_suspects`): the first NaN/Inf
   origin, watchpoint hits, or the first difference against a reference dump.
3. Run 2 re-runs the script dumping whole tensors of only the suspect operators (and the
   producers of their inputs) at only the suspect iterations.
4. Run 2's statistics at the suspects are checked against run 1's
   (:mod:`.triage_verify`); when they differ the script is not deterministic and no origin
   is reported from run 2's files.

Everything lands in one fresh folder: ``run1.json``/``run2.json`` (the configs),
``run1/``/``run2/`` (the dumps), ``run1.log``/``run2.log`` (the script's output),
``triage.json`` (the report as data) and ``triage.html`` (:mod:`.triage_report`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .reader import open_dump
from .triage_config import run1_config, run2_config, write_config
from .triage_suspects import Suspects, from_overflow, from_reference, from_watch
from .triage_verify import Reproduction, check_reproduction
from .whole_files import write_text

__all__ = ["Run", "TriageResult", "TriageError", "triage", "default_folder"]

#: exit statuses of ``opdump triage``
EXIT_NOTHING, EXIT_FOUND, EXIT_ERROR, EXIT_NOT_REPRODUCED = 0, 1, 2, 3


class TriageError(RuntimeError):
    """Triage could not go on (a bad config, a run that left no dump)."""


@dataclass
class Run:
    """One run of the script: its config, dump folder, log, command and exit status."""

    name: str
    config: str
    dump: str
    log: str
    command: List[str]
    cwd: str
    returncode: Optional[int] = None

    @property
    def shell_command(self) -> str:
        return f"cd {shlex.quote(self.cwd)} && {shlex.join(self.command)}"

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "config": self.config, "dump": self.dump, "log": self.log,
                "command": self.shell_command, "returncode": self.returncode}


@dataclass
class TriageResult:
    folder: str
    mode: str
    script: List[str]
    run1: Run
    suspects: Suspects
    run2: Optional[Run] = None
    reproduction: Optional[Reproduction] = None
    files: Dict[str, List[str]] = field(default_factory=dict)     # suspect -> run 2's files
    html: Optional[str] = None

    @property
    def found(self) -> bool:
        return self.suspects.found

    @property
    def exit_code(self) -> int:
        if not self.found:
            return EXIT_NOTHING
        if self.reproduction is None or not self.reproduction.reproduced:
            return EXIT_NOT_REPRODUCED
        return EXIT_FOUND

    def to_dict(self) -> Dict[str, Any]:
        s = self.suspects
        return {
            "folder": self.folder, "mode": self.mode, "script": self.script, "found": self.found,
            "reproduced": self.reproduction.reproduced if self.reproduction else None,
            "reproduction": (None if self.reproduction is None else
                             {"compared": self.reproduction.compared, "mismatches": self.reproduction.mismatches,
                              "missing": self.reproduction.missing}),
            "origin": s.origin.to_dict() if s.origin else None,
            "suspects": {"operators": s.ops, "parameters": s.parameters, "iterations": s.iterations, "rank": s.rank},
            "runs": [r.to_dict() for r in (self.run1, self.run2) if r is not None],
            "files": self.files, "notes": s.notes, "html": self.html, "exit_code": self.exit_code,
        }

    def summary(self) -> str:
        """The answer first (origin, source line, whether run 2 reproduced it, the files), then
        each run with the command that reproduces it."""
        s, o, rep = self.suspects, self.suspects.origin, self.reproduction
        runs = [f"run 1 (statistics): {self.run1.dump}  [exit {self.run1.returncode}]",
                f"  reproduce: {self.run1.shell_command}"]
        if self.run2 is not None:
            runs += [f"run 2 (tensors of {len(s.kernels)} suspect(s) at iteration(s) "
                     f"{'|'.join(map(str, s.iterations))}): {self.run2.dump}  [exit {self.run2.returncode}]",
                     f"  reproduce: {self.run2.shell_command}"]
        if o is None:
            lines = [{"overflow": "no NaN/Inf found in run 1",
                      "watch": "no watchpoint hit in run 1",
                      "reference": "run 1 does not differ from the reference"}[self.mode]]
            lines += [f"  {n}" for n in s.notes[:3] if self.mode == "reference"]
            return "\n".join(lines + runs)
        if rep is None or not rep.reproduced:
            lines = ["NOT REPORTED: " + (rep.describe() if rep is not None else "run 2 did not run"),
                     f"  run 1 pointed at {o.op} (iteration {o.iteration}); the script does not compute the "
                     "same values twice: fix its seeds and set torch.use_deterministic_algorithms(True) "
                     "(README, Analysis: triage), then triage again"]
            return "\n".join(lines + runs)
        head = {"operator": "origin: first operator producing NaN/Inf",
                "argument": "origin: NaN/Inf brought in by a non-tensor argument of",
                "input": "origin: NaN/Inf first seen in the inputs of",
                "hit": "first watchpoint hit",
                "difference": "first difference from the reference",
                "divergence": "first divergence from the reference"}.get(o.kind, "origin")
        lines = [f"{head}: {o.op}",
                 f"  type {o.op_type or '?'}, iteration {o.iteration}, rank {o.rank}"
                 + (f", graph {o.graph}" if o.graph is not None else "")]
        if o.source:
            lines.append(f"  source: {o.source}  {o.code}")
        if o.detail:
            lines.append(f"  {o.detail}")
        lines.append(rep.describe())
        lines.append("files (run 2):")
        for name in s.kernels:
            paths = self.files.get(name) or []
            lines.append(f"  {name}: " + ("(no file)" if not paths else f"{len(paths)} file(s)"))
            lines += [f"    {p}" for p in paths]
        return "\n".join(lines + runs)


def default_folder(base: str = ".") -> str:
    """A fresh folder name: ``./opdump_triage_YYYYmmdd_HHMMSS`` (``_2``… when taken)."""
    stem = os.path.join(os.path.abspath(base), "opdump_triage_" + _dt.datetime.now().strftime("%Y%m%d_%H%M%S"))
    path, n = stem, 1
    while os.path.exists(path):
        n += 1
        path = f"{stem}_{n}"
    return path


def _launch(name: str, folder: str, doc: Dict[str, Any], script: Sequence[str], cwd: str,
            echo: bool) -> Run:
    cfg = write_config(doc, os.path.join(folder, f"{name}.json"))
    log = os.path.join(folder, f"{name}.log")
    cmd = [sys.executable, "-m", "opdump", "run", "--config", cfg, *script]
    run = Run(name, cfg, doc["common_dump_settings"]["path"], log, cmd, cwd)
    env = dict(os.environ)
    env.pop("OPDUMP_CONFIG", None)
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.readline(), b""):
            f.write(chunk)
            if echo:
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()
        run.returncode = proc.wait()
    return run


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(f.read().splitlines(True)[-n:]).decode("utf-8", "replace")
    except OSError:
        return ""


def _open_run(run: Run):
    """The run's dump; a run that dumped nothing (the script failed before its first step, or
    never ran a model) is an error that shows the end of its log, never "nothing found"."""
    try:
        d = open_dump(run.dump)
        empty = not (d.has_statistics or d.has_tensors)
    except Exception as e:  # noqa: BLE001 - reported with the run's log
        why = str(e)
    else:
        if not empty:
            return d
        why = "no tensor and no statistics were dumped"
    raise TriageError(f"{run.name} left nothing to analyse in {run.dump} (script exit status {run.returncode}): "
                      f"{why}\nlast lines of {run.log}:\n{_tail(run.log)}")


def triage(script: Sequence[str], *, config: Optional[str] = None, folder: Optional[str] = None,
           iterations: Optional[str] = None, conditions: Optional[Sequence[str]] = None,
           reference: Optional[str] = None, max_suspects: int = 5, html: bool = True,
           progress: bool = True, echo: bool = False, cwd: Optional[str] = None,
           log=None) -> TriageResult:
    """Run the triage of ``script`` (the launcher's arguments: ``train.py args…`` or
    ``-m module args…``). ``log``: a callable told each stage (``print`` in the CLI)."""
    say = log or (lambda msg: None)
    if not script:
        raise TriageError("no script to run")
    if conditions and reference:
        raise TriageError("--cond and --reference are exclusive: one kind of suspect per triage")
    folder = os.path.abspath(folder or default_folder())
    if os.path.exists(folder) and os.listdir(folder):
        raise TriageError(f"{folder} exists and is not empty: triage writes into a fresh folder")
    os.makedirs(folder, exist_ok=True)
    cwd = os.path.abspath(cwd or os.getcwd())
    mode = "watch" if conditions else ("reference" if reference else "overflow")
    if reference:
        open_dump(reference)                   # a bad reference fails before the script runs
    doc1 = run1_config(os.path.join(folder, "run1"), config, iterations)
    say(f"run 1: statistics -> {doc1['common_dump_settings']['path']} (output: {folder}/run1.log)")
    run1 = _launch("run1", folder, doc1, script, cwd, echo)
    dump1 = _open_run(run1)
    say(f"run 1 finished (exit {run1.returncode}); looking for suspects ({mode})")
    if mode == "overflow":
        sus = from_overflow(dump1, progress=progress)
    elif mode == "watch":
        sus = from_watch(dump1, list(conditions or ()), max_suspects=max_suspects, progress=progress)
    else:
        sus = from_reference(dump1, str(reference), progress=progress)
    result = TriageResult(folder, mode, list(script), run1, sus)
    if sus.found:
        doc2 = run2_config(doc1, os.path.join(folder, "run2"), sus.kernels, sus.iterations)
        say(f"run 2: tensors of {len(sus.kernels)} suspect(s) at iteration(s) "
            f"{'|'.join(map(str, sus.iterations))} -> {doc2['common_dump_settings']['path']} "
            f"(output: {folder}/run2.log)")
        result.run2 = _launch("run2", folder, doc2, script, cwd, echo)
        try:
            dump2 = _open_run(result.run2)
        except TriageError as e:           # run 2 dumped none of the suspects: not reproduced
            result.reproduction = Reproduction(missing=[str(e).splitlines()[0]])
            dump2 = None
        else:
            result.reproduction = check_reproduction(dump1, dump2, sus.kernels, sus.iterations, sus.rank)
        files: Dict[str, List[str]] = {}
        for tf in (dump2.tensor_files(rank=sus.rank) if dump2 is not None else []):
            for name in sus.kernels:
                if tf.op in (name, _file_form(name)) or tf.op_file == _file_form(name):
                    files.setdefault(name, []).append(str(tf.path))
        result.files = {k: sorted(v) for k, v in files.items()}
    if html:
        from .triage_report import write_triage_html
        result.html = os.path.join(folder, "triage.html")
        write_triage_html(result, dump1, result.html, progress=progress)
    _write_json(result, os.path.join(folder, "triage.json"))
    return result


def _file_form(name: str) -> str:
    from ..format.names import sanitize
    return sanitize(name)


def _write_json(result: TriageResult, path: str) -> None:
    write_text(path, json.dumps(result.to_dict(), indent=1, default=str))
