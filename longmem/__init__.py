"""LongMem: a frozen language model with a long-term memory (Wang et al., "Augmenting Language Models with
Long-Term Memory"). Library first; the CLI (``longmem``) and the web app are thin layers on top."""

from .backbone import Backbone, load_backbone
from .baselines import BackboneLM, MemTRM
from .ingest import ingest
from .lm import Sampling
from .memory import MemoryBank, Retrieved
from .model import LongMemConfig, LongMemModel
from .readers import DemoFormat
from .store import Bank, BankError, Store
from .tasks import Chat, Classifier

__all__ = ["Backbone", "BackboneLM", "Bank", "BankError", "Chat", "Classifier", "DemoFormat", "LongMemConfig",
           "LongMemModel", "MemTRM", "MemoryBank", "Retrieved", "Sampling", "Store", "ingest", "load_backbone"]
__version__ = "0.1.0"
