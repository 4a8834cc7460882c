"""Configuration: dialects in, one validated :class:`DumpConfig` out."""
from .errors import ConfigError
from .model import ALL_STATISTICS, DEFAULT_STATISTICS, DumpConfig, IterationSpec

__all__ = ["ConfigError", "DumpConfig", "IterationSpec", "ALL_STATISTICS", "DEFAULT_STATISTICS", "load_config"]


def load_config(*args, **kwargs) -> DumpConfig:
    """Load and validate a config; see :func:`opdump.config.loader.load_config`."""
    from .loader import load_config as _load
    return _load(*args, **kwargs)
