"""The frontend: Python source → IR. `trace` builds the IR of one specialization of a kernel."""
from .tracer import trace

__all__ = ["trace"]
