"""Parallel layout as pure functions (no process groups): rank coordinates and groups by order."""
from .layout import Layout, rack_of_rank

__all__ = ["Layout", "rack_of_rank"]
