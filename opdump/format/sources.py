"""Source lines of the ``.ir`` listing: ``# In file …`` lines and :class:`SourceFrame`.

Why: the listing shows, per operator, the Python lines it came from; the writer
renders them and the reader (``opdump locate``) parses them, in opdump's form and in
MindSpore's (docs/design.md, "Graph listing").

Forms::

    # In file ./train.py(175)/        x = self.conv3(x)/              (opdump, the seed's form)
    # In file /p/train.py:59~60, 8~27/        x = self.fc1(x)/        (MindSpore 2.x)

Guarantees: ``parse_source_line(render_source_line(f, n, code))`` gives back ``f``,
``n`` and ``code.strip()`` for any file path and code without a line break.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional


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


def render_source_line(file: str, line: int, code: str) -> str:
    """``# In file <path>(<line>)/ <code>/`` (opdump's form)."""
    return f"# In file {file}({line})/ {code}/"


_IN_FILE_SEED = re.compile(r"#\s*In file\s+(?P<file>.+?)\((?P<line>\d+)\)/(?P<code>.*?)/?\s*$")
_IN_FILE_MS = re.compile(
    r"#\s*In file\s+(?P<file>.+?):(?P<line>\d+)(?:~(?P<line_end>\d+))?"
    r"(?:,\s*(?P<col>\d+)(?:~(?P<col_end>\d+))?)?/(?P<code>.*?)/?\s*$"
)
_SHARED_NOTE_RE = re.compile(r"/?<~~.*$")        # MindSpore: "<~~This line of code can be shared…"


def parse_source_line(text: str) -> Optional[SourceFrame]:
    """Parse one ``# In file`` line (either form); None when it is not one."""
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
