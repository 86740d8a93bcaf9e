"""Names of settings that were renamed, so that files written under the old name still load.

A checkpoint's ``config.json``, a bank's saved classifiers and an evaluation's recorded work units are JSON written
by earlier versions; each reader passes what it read through ``current_names`` before using it. Banks rename their
own columns by a schema migration (``longmem.storage.schema``)."""

from __future__ import annotations

RENAMED = {"csz": "chunk_size"}  # old name -> the name the code uses now


def current_names(d: dict) -> dict:
    """``d`` with every renamed key under its current name (one level deep; the values are not copied). A key
    present under both names keeps the current one's value."""
    out = {}
    for k, v in d.items():
        new = RENAMED.get(k)
        if new is None:
            out[k] = v
        elif new not in d:
            out[new] = v
    return out
