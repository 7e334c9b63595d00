"""The one error type of the config package (its own module, so loading and validation need not
import each other)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config file or value is invalid; the message names the file and key."""
