"""Old import path of the file-name rules: they live in :mod:`opdump.format.names` and
:mod:`opdump.format.files` (one grammar for the writer and the reader).  Kept while
other modules move over; new code imports :mod:`opdump.format`."""
from __future__ import annotations

from ..format.files import MAX_NAME_BYTES, parameter_file_name, tensor_file_name, too_long
from ..format.names import file_stem, sanitize

__all__ = ["MAX_NAME_BYTES", "sanitize", "file_stem", "tensor_file_name", "parameter_file_name", "too_long"]
