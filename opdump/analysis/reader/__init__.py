"""Reading dumps: the one place in opdump's analysis that knows the on-disk layout.

The layout and the file names are :mod:`opdump.format` (docs/design.md), the same
definitions the writer uses; this package reads a dump with them:

* :mod:`.open`        finding the ranks from whatever path is given; :func:`open_dump`
* :mod:`.scan`        reading a rank's folders and mapping files back to operators
* :mod:`.containers`  :class:`Rank`, :class:`Graph`, :class:`Iteration`
* :mod:`.files`       :class:`TensorFile`, loading arrays (memory-mapped, never unpickled)
* :mod:`.file_columns` a folder's tensor files as columns, their objects made on first use
* :mod:`.statistics`  reading ``statistic.csv``
* :mod:`.sources`     which source frames are the user's; reading a ``.ir`` file
* :mod:`.ops`         :class:`OpInfo`
* :mod:`.records`     the records table (tensors and statistics joined, in execution order)
* :mod:`.dump`        :class:`Dump`: objects and pandas tables

Everything else in :mod:`opdump.analysis` works on the objects and tables this
package returns (:class:`Dump`, :meth:`Dump.records`), never on paths.  The
``op_name`` of a file name is the operator's full name sanitised
(:func:`opdump.format.names.sanitize`), which is not reversible: files are mapped back
by sanitising the full names the dump knows (execution orders, ``.ir``/``.json``
listings, ``statistic.csv``) and matching.  pandas is imported only by the tables.
"""
from ...format.dtypes import is_complex_dtype, is_float_dtype
from ...format.names import kind_of_name, op_type_of, sanitize, scope_of
from .containers import Graph, Iteration, Rank
from .dump import Dump
from .files import TensorFile, load_array, npy_header, parse_tensor_filename
from .open import DumpError, load_statistics, open_dump
from .ops import OpInfo
from .sources import SourceFrame, is_library_file, parse_ir, parse_source_line
from .statistics import NUMERIC_STATS, STAT_COLUMNS

__all__ = [
    "Dump", "Rank", "Graph", "Iteration", "OpInfo", "SourceFrame", "TensorFile",
    "open_dump", "load_statistics", "sanitize", "op_type_of", "scope_of", "kind_of_name",
    "is_float_dtype", "is_complex_dtype", "is_library_file", "parse_tensor_filename", "parse_ir",
    "parse_source_line", "load_array", "npy_header", "DumpError", "STAT_COLUMNS", "NUMERIC_STATS",
]
