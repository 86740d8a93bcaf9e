"""The model: the frozen backbone and its one adapter to Hugging Face internals (``backbone``), the
residual SideNet (``sidenet``, ``lora``), the segment loop shared by every model (``lm``), ``LongMemModel`` and its
checkpoints (``longmem``), the baselines (``baselines``: the backbone alone, MemTRM; ``embedder``: MiniLM for
embedding RAG) and how a command sets up torch (``cpu``). Reads and writes the in-RAM memory; knows no bank."""

from longmem.model.longmem import LongMemConfig, LongMemModel

__all__ = ["LongMemConfig", "LongMemModel"]
