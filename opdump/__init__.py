"""opdump: dump what every operator of a PyTorch model received and produced.

Quick use::

    with opdump.Session("/abs/data_dump.json") as dump:
        model = torch.compile(model, backend=opdump.backend())
        for x, y in data:
            loss_fn(model(x), y).backward(); opt.step()   # opt.step() advances the iteration

or, with no code change, ``opdump run --config data_dump.json train.py``.
"""
from .config import ConfigError, DumpConfig, load_config
from .session import Session, current_session
from .select import set_dump
from .version import __version__

__all__ = ["Session", "session", "backend", "set_dump", "step", "load_config", "ConfigError",
           "DumpConfig", "load", "current_session", "__version__"]


def session(config=None, **kwargs) -> Session:
    """``with opdump.session("data_dump.json"):`` — same as :class:`Session`."""
    return Session(config, **kwargs)


def backend(real="inductor", *, session: Session = None, **real_options):
    """A ``torch.compile`` backend that dumps and otherwise runs ``real`` (default inductor)."""
    from .capture.graph.backend import backend as _backend
    from .session import current_session, refuse_graph_overflow
    held = session if session is not None else current_session(create=False)
    if held is not None:
        refuse_graph_overflow(held.config)      # the overflow dump is eager-only
    return _backend(real, session=session, **real_options)


def step() -> None:
    """Mark a training-step boundary in the current session (when no optimizer does)."""
    current = current_session(create=False)
    if current is None:
        raise RuntimeError("opdump.step(): no active session")
    current.step()


def load(path):
    """Open a dump (opdump's or MindSpore's) for analysis; needs pandas."""
    from .analysis.reader import open_dump
    return open_dump(path)
