"""Typed configuration: schema, loading, MLPerf rules, derived values, validation."""
from .derived import Derived, derive
from .env import launch_env
from .errors import ConfigError
from .load import load_config
from .rules import BENCHMARKS, LLAMA31_405B, TINY_LLAMA31, BenchmarkRules, HParams, hparams
from .schema import Config
from .validate import problems, validate

__all__ = ["BENCHMARKS", "LLAMA31_405B", "TINY_LLAMA31", "BenchmarkRules", "Config", "ConfigError",
           "Derived", "HParams", "derive", "hparams", "launch_env", "load_config", "problems",
           "validate"]
