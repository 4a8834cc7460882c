"""Which ATen overloads are operators, shared by graph and eager capture.

Why here: both front-ends must agree on what counts as an operator, or the
same program gets different ``-op<N>`` numbers in the two modes.
"""
from __future__ import annotations

#: ATen op names that are bookkeeping, not computation: symbolic size queries and
#: runtime asserts.  They get no operator name, no files and no ``-op<N>`` number.
NOT_OPERATORS = frozenset({"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_assert_scalar",
                           "_assert_async", "_local_scalar_dense_noop"})
