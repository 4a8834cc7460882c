"""Reading dumps: the one place in opdump's analysis that knows file layouts.

Layout (seed 000, "Dump in CPU/GPU mode", and what opdump writes)::

    {root}/rank_{r}/.dump_metadata/{data_dump.json, config.json, manifest.json}
    {root}/rank_{r}/{net_name}/{graph_id}/{iteration}/
        {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}[.{dtype}].npy
        statistic.csv   mapping.csv   {op_type}.{op_name}.json
        Parameter.{name}.0.0.{timestamp}.output.0.DefaultFormat[.{dtype}].npy
    {root}/rank_{r}/{net_name}/{graph_id}/constants/Parameter.data-{id}.0.0.{ts}.output.0.DefaultFormat[.{dtype}].npy
    {root}/rank_{r}/graphs/ms_output_trace_code_graph_{g}.ir  (+ opdump's .json twin)
    {root}/rank_{r}/execution_order/ms_execution_order_graph_{g}.csv
    {root}/rank_{r}/execution_order/ms_global_execution_order_graph_{g}.csv

Everything else in :mod:`opdump.analysis` works on the objects and tables this
module returns (:class:`Dump`, :meth:`Dump.records`), never on paths.

The ``op_name`` of a file name is the operator's full name with ``.``, ``/``,
``\\`` and spaces replaced by ``_`` -- not reversible, so files are mapped back
to operators by sanitising the full names the dump knows (execution order,
``.ir``/``.json`` graph files, ``statistic.csv``) and matching.

Arrays are loaded lazily and memory-mapped (``np.load(mmap_mode="r",
allow_pickle=False)``); pandas is imported here (analysis only).
"""
from .dump import Dump, Graph, Iteration, Rank
from .files import TensorFile, _npy_header, load_array, parse_tensor_filename
from .names import is_complex_dtype, is_float_dtype, kind_of_name, op_type_of, sanitize, scope_of
from .open import DumpError, load_statistics, open_dump
from .ops import OpInfo
from .sources import SourceFrame, is_library_file, parse_ir, parse_source_line
from .statistics import NUMERIC_STATS, STAT_COLUMNS

__all__ = [
    "Dump", "Rank", "Graph", "Iteration", "OpInfo", "SourceFrame", "TensorFile",
    "open_dump", "load_statistics", "sanitize", "op_type_of", "scope_of",
    "is_float_dtype", "is_library_file", "parse_tensor_filename", "DumpError",
    "STAT_COLUMNS",
]
