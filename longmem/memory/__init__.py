"""The in-RAM searchable memory (``Memory``): chunked keys/values of the backbone's layer m in faiss
indexes, one row per stream, with ``add`` / ``search`` / ``clear``. It is passed into a model's forward, never
hidden inside it. Imports nothing above the utilities."""

from longmem.memory.memory import Memory
from longmem.memory.search import StoredKeys
from longmem.memory.view import MemoryView, Retrieved, Selected

__all__ = ["Memory", "MemoryView", "Retrieved", "Selected", "StoredKeys"]
