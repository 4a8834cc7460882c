"""Capture front-ends (graph: torch.compile backend; eager: dispatch mode) and the
naming they share.  Both hand tensors to :class:`opdump.recorder.Recorder`."""
