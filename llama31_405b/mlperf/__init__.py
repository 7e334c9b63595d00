"""MLPerf logging: the header events of a config (shared by training and the compliance precheck)."""
from .header import Event, header_events

__all__ = ["Event", "header_events"]
