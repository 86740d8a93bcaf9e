"""Plain helpers several test files share (fixtures live in ``conftest.py``): the story book the passage, answer and
evaluation tests read, and the environment of a child Python process that imports the tests' own modules.

``tests/`` is on ``sys.path`` through pytest's ``pythonpath`` setting (pyproject.toml), so ``from helpers import
story`` works in any test file."""

from __future__ import annotations

import os
import random
from pathlib import Path

TESTS = Path(__file__).parent

NOUNS = ["keeper", "lantern", "harbour", "ferry", "orchard", "miller", "widow", "captain", "stable", "bridge"]
VERBS = ["counted", "painted", "mended", "watched", "carried", "sold", "found", "lost"]


def story(chapters: int = 3, paragraphs: int = 6, seed: int = 0, zeppelin: bool = True,
          titles: tuple[str, ...] = ()) -> str:
    """A book of ``chapters`` chapters ("CHAPTER I", ...) of prose paragraphs; with ``zeppelin``, chapter 2's third
    paragraph tells of a zeppelin (a word found nowhere else); ``titles``: each chapter's title, printed under its
    heading (a collection of stories: "CHAPTER II" then "The Iron Mill")."""
    rng = random.Random(seed)
    out = ["THE LIGHTHOUSE STORY\n\n"]
    for c in range(chapters):
        out.append(f"CHAPTER {'I' * (c + 1)}\n\n" + (f"{titles[c]}\n\n" if titles else ""))
        for p in range(paragraphs):
            sentences = [f"The {rng.choice(NOUNS)} {rng.choice(VERBS)} {rng.randint(2, 99)} "
                         f"{rng.choice(NOUNS)}s before {rng.choice(['dawn', 'noon', 'dusk'])}."
                         for _ in range(rng.randint(3, 7))]
            if zeppelin and (c, p) == (1, 2):
                sentences.insert(1, "A silver zeppelin drifted over the harbour that morning.")
            out.append(" ".join(sentences) + "\n\n")
    return "".join(out)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child Python that imports ``longmem`` and the tests' modules (``tiny``,
    ``test_training``): the repository and ``tests/`` on its ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), **extra}
