"""Source frames and graph files: :class:`SourceFrame` (one ``# In file`` line), telling
library code from the user's, parsing ``# In file`` lines (the seed's and MindSpore 2.x's
forms) and reading the operators of a ``ms_output_trace_code_graph_{g}.ir`` file
(:func:`parse_ir`: full names, source frames, input/output types).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

@dataclass(frozen=True)
class SourceFrame:
    """One ``# In file`` line of a graph file: where (part of) an operator comes from."""

    file: str
    line: int
    line_end: Optional[int] = None
    col: Optional[int] = None
    col_end: Optional[int] = None
    code: str = ""

    @property
    def is_library(self) -> bool:
        return is_library_file(self.file)

    @property
    def is_definition(self) -> bool:
        c = self.code.lstrip()
        return c.startswith(("def ", "async def ", "class ", "@"))

    def covers(self, line: int) -> bool:
        """Does this frame stand for ``line``? A ``def``/``class`` frame (a whole function's
        range, as MindSpore writes the enclosing function) only stands for its first line."""
        if self.line_end is None or self.is_definition:
            return self.line == line
        return self.line <= line <= self.line_end

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> Dict[str, Any]:
        return {"file": self.file, "line": self.line, "line_end": self.line_end, "code": self.code}


_LIB_RE = re.compile(
    r"(site-packages|dist-packages|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<|[/\\]torch[/\\](nn|_dynamo|fx|"
    r"_functorch|autograd|utils|_tensor|overrides|_ops|_refs|_decomp|_prims|functional)|"
    r"[/\\]opdump[/\\](capture|write|stats|select|debug|recorder))"
)


def is_library_file(path: str) -> bool:
    """Library (framework, site-packages, stdlib, opdump itself) vs the user's code."""
    return bool(_LIB_RE.search(path or ""))


# seed:  # In file ./train.py(175)/        x = self.conv3(x)/
_IN_FILE_SEED = re.compile(r"#\s*In file\s+(?P<file>.+?)\((?P<line>\d+)\)/(?P<code>.*?)/?\s*$")
# MindSpore 2.x:  # In file /p/train.py:59~60, 8~27/        x = self.fc1(x)/
_IN_FILE_MS = re.compile(
    r"#\s*In file\s+(?P<file>.+?):(?P<line>\d+)(?:~(?P<line_end>\d+))?"
    r"(?:,\s*(?P<col>\d+)(?:~(?P<col_end>\d+))?)?/(?P<code>.*?)/?\s*$"
)
_FULLNAME_RES = (
    re.compile(r"#\s*Fullname with scope:\s*\((?P<name>.+)\)\s*$"),
    re.compile(r"full_name_with_scope:\s*\((?P<name>.+)\)\s*$"),
)
_IR_NODE_RE = re.compile(r"^\s*%\d+(?:\([^)]*\))?\s*=\s*(?P<prim>[^\s(]+)")
_IR_BARE_NODE_RE = re.compile(r"^ {0,2}(?P<prim>[A-Za-z_][\w.]*)\(")        # Return(%1) …
_SHARED_NOTE_RE = re.compile(r"/?<~~.*$")                                   # "<~~This line of code can be shared…"
_IR_TYPES_RE = re.compile(r"^\s*:\s*\((?P<ins>.*)\)\s*->\s*\((?P<outs>.*)\)\s*$")
_IR_TENSOR_RE = re.compile(r"<(?:Ref\[)?Tensor\[(?P<dtype>\w+)\]\]?,\s*\((?P<shape>[^)]*)\)")


def parse_source_line(text: str) -> Optional[SourceFrame]:
    """Parse one ``# In file`` line (seed or MindSpore 2.x form); None when it is not one."""
    text = _SHARED_NOTE_RE.sub("/", text.rstrip())
    m = _IN_FILE_SEED.search(text)
    if m:
        return SourceFrame(m.group("file").strip(), int(m.group("line")), code=m.group("code").strip())
    m = _IN_FILE_MS.search(text)
    if m:
        def _i(k):
            v = m.group(k)
            return int(v) if v is not None else None
        return SourceFrame(m.group("file").strip(), int(m.group("line")), _i("line_end"),
                           _i("col"), _i("col_end"), m.group("code").strip())
    return None


def _parse_ir_types(text: str) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    m = _IR_TYPES_RE.match(text)
    if not m:
        return [], []

    def _t(s):
        out = []
        for tm in _IR_TENSOR_RE.finditer(s):
            shape = [int(x) for x in re.findall(r"-?\d+", tm.group("shape"))]
            out.append({"dtype": tm.group("dtype"), "shape": shape})
        return out
    return _t(m.group("ins")), _t(m.group("outs"))


def parse_ir(path: Path) -> List[Dict[str, Any]]:
    """Operators of a ``.ir`` file: ``[{full_name, sources: [SourceFrame], inputs, outputs}]``.

    Accepts MindSpore 2.x (``# Fullname with scope: (…)``, ``# In file f:l~l, c~c/ code/``)
    and the seed's older form (``: full_name_with_scope: (…)``, ``# In file f(l)/ code/``).
    """
    ops: List[Dict[str, Any]] = []
    cur: Optional[Dict[str, Any]] = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            m = _IR_NODE_RE.match(line) or _IR_BARE_NODE_RE.match(line)
            if m and not line.lstrip().startswith(("#", ":")):
                cur = {"full_name": None, "sources": [], "inputs": [], "outputs": [], "prim": m.group("prim")}
                ops.append(cur)
                continue
            if cur is None:
                continue
            s = line.strip()
            if s.startswith("}"):
                cur = None
                continue
            if cur["full_name"] is None:
                for rx in _FULLNAME_RES:
                    m = rx.search(s)
                    if m:
                        cur["full_name"] = m.group("name").strip()
                        break
                else:
                    if not cur["inputs"] and not cur["outputs"] and s.startswith(":"):
                        cur["inputs"], cur["outputs"] = _parse_ir_types(s)
                    elif s.startswith("#") and "In file" in s:
                        fr = parse_source_line(s)
                        if fr:
                            cur["sources"].append(fr)
                    continue
                continue
            if "In file" in s:
                fr = parse_source_line(s)
                if fr:
                    cur["sources"].append(fr)
    return [o for o in ops if o["full_name"]]
