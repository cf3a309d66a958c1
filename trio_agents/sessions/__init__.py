"""Sessions: where conversations live between runs."""

from ._base import Session as Session
from ._memory import MemorySession as MemorySession

__all__ = ["MemorySession", "Session"]
