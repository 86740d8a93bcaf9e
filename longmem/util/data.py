"""Where the project's files live: the shared data (books, ICL sets, SQuAD, papers; ``data_dir``) and the cache of
derived files (``cache_root``), one function each for every command.

``$LONGMEM_DATA_DIR`` when set; otherwise the ``shared/data`` folder beside a source checkout (the layout this
project is developed in: ``<work>/main`` next to ``<work>/shared/data``), looked for from this file and from the
working directory. An installed package has no checkout beside it, so there the variable is how to point at the data.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DATA_ENV = "LONGMEM_DATA_DIR"
CACHE_ENV = "LONGMEM_CACHE_DIR"


def cache_root() -> Path:
    """Where derived files live (the safetensors copy of the default backbone, fetched models, tokenized books);
    ``$LONGMEM_CACHE_DIR`` overrides the user's cache folder."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("longmem"))


def data_dir() -> Path:
    """The shared data folder (it may not exist: readers of a file in it report which path they tried)."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    checkout = Path(__file__).resolve().parents[2]  # longmem/util/data.py -> the checkout's root
    for root in (checkout, Path.cwd()):
        for candidate in (root.parent / "shared" / "data", root / "shared" / "data"):
            if candidate.is_dir():
                return candidate
    return checkout.parent / "shared" / "data"


def add_data_flag(p: argparse.ArgumentParser, what: str = "books/, MANIFEST.md") -> None:
    """``--data``: the shared data folder a command reads, as a ``Path`` (default: ``data_dir()``)."""
    p.add_argument("--data", type=Path, default=data_dir(),
                   help=f"shared data folder ({what}; default: ${DATA_ENV} or ../shared/data)")
