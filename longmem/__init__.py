"""LongMem: a frozen language model with a long-term memory (Wang et al., "Augmenting Language Models with
Long-Term Memory"). Library first; the CLI (``longmem``) and the web app are thin layers on top."""

from longmem.ingest.readers import DemoFormat
from longmem.memory.memory import Memory
from longmem.memory.view import Retrieved
from longmem.model.backbone import Backbone, load_backbone
from longmem.model.baselines import BackboneLM, MemTRM
from longmem.model.lm import Sampling
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.storage import Bank, BankDirectory, BankError
from longmem.tasks.chat import Chat
from longmem.tasks.classify import Classifier

__all__ = ["Backbone", "BackboneLM", "Bank", "BankError", "Chat", "Classifier", "DemoFormat", "LongMemConfig",
           "LongMemModel", "MemTRM", "Memory", "Retrieved", "Sampling", "BankDirectory", "load_backbone"]
__version__ = "0.1.0"
