"""Graph mode: opdump as a ``torch.compile`` backend (README, "How it works").

The entry point is :func:`opdump.capture.graph.backend.backend`.  This package's
``__init__`` imports nothing, so the kernel-level dump (``capture/kernels``), which
builds on the runtime, inputs and listing modules here, does not import the backend
that dispatches to it.
"""
