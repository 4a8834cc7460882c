"""Configuration: dialects in, one validated :class:`DumpConfig` out."""
from .errors import ConfigError
from .loader import load_config, load_config_dict
from .model import ALL_STATISTICS, DEFAULT_STATISTICS, DumpConfig, IterationSpec
from .options import DumpOptions, from_options

__all__ = ["ConfigError", "DumpConfig", "IterationSpec", "ALL_STATISTICS", "DEFAULT_STATISTICS", "load_config",
           "load_config_dict", "DumpOptions", "from_options"]

