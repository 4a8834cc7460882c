"""Kernel-level graph dump (``graph_dump: "kernels"``): inductor's compiled kernels, observed
(README, "Kernel-level graph dump").  :mod:`.compile` builds the observed variant of a graph,
:mod:`.wrapper` adds the taps to inductor's wrapper code, :mod:`.origins` names the fused
ATen operators, :mod:`.compare` runs ``compare_compiled``."""
