"""The one exception of the data package."""
from __future__ import annotations


class DataError(ValueError):
    """Data is missing, malformed, unverified or inconsistent; the message names the file and
    what to do."""
