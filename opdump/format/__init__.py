"""The on-disk dump format, defined once for the writer (:mod:`opdump.write`) and the
reader (:mod:`opdump.analysis.reader`), as docs/design.md describes it.

One module per part, each without I/O and without dependencies above it (no torch,
nothing else of opdump; numpy/protobuf only where a module says so):

* :mod:`.names`       operator full names and their file-name form (:func:`sanitize`)
* :mod:`.files`       tensor / parameter / kernel-argument file names, built and parsed;
                      ``mapping.csv`` for names over 255 bytes
* :mod:`.layout`      the folder tree (paths and their patterns), execution-order CSVs
* :mod:`.dtypes`      dtype names (MindSpore's spelling <-> torch) and how each is stored
* :mod:`.statistics`  the statistic categories and ``statistic.csv`` columns
* :mod:`.sources`     ``# In file`` source lines and :class:`SourceFrame`
* :mod:`.listing`     the ``.ir`` / ``.json`` graph listing, rendered and parsed
* :mod:`.acl_layout`  the ACL/GE folder tree and bin file names (ACL/torchair/TF-adapter dialects)
* :mod:`.ascend_bin`  the Ascend bin file (DumpData protobuf + raw bytes), encoded and decoded
                      (numpy, protobuf; :mod:`.ascend_dtypes` its dtype table, ``dump_data.proto``)
* :mod:`.device_formats` Ascend device formats (NC1HWC0, FRACTAL_Z, …) to host layout and back (numpy)
"""
from .dtypes import dtype_name
from .files import TensorName, parameter_file_name, parse_tensor_name, tensor_file_name
from .names import file_stem, full_name, parse_full_name, sanitize

__all__ = ["sanitize", "file_stem", "full_name", "parse_full_name", "TensorName", "tensor_file_name",
           "parameter_file_name", "parse_tensor_name", "dtype_name"]
