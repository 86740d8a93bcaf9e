"""A pytest plugin: every test runs as on a fresh clone with no shared data beside it, unless it says it reads the
data (``@pytest.mark.shared_data``).

A user who clones the repository has no ``shared/data`` folder (books, ICL sets, SQuAD): a test that reads it must
skip there, saying why, or ``make test`` fails for them while it passes in CI, which has the folder. So for the whole
run ``$LONGMEM_DATA_DIR`` points at an empty folder (``longmem.util.data.data_dir`` then looks nowhere else), in this
process and in the commands its tests start; a test marked ``shared_data`` gets the real folder back for its own
duration, or is skipped, saying so, where there is none; a test or fixture that reads a file of it by path asks for
the fixture ``shared_data_dir`` (skipped the same way), and so does a module- or session-scoped fixture (the mark
gives the real folder back only for the test itself). A test added later that reads the data without the mark finds
the empty folder and fails in every run, CI's included. The folder counts as there when it has its MANIFEST.md.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from longmem.util.data import DATA_ENV, data_dir

MARK = "shared_data"
_KEY = pytest.StashKey[tuple]()  # (the real data folder, the variable's value before the run, the empty folder)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: reads the shared data folder (books, ICL sets, SQuAD); skipped, "
                                       "saying so, where it is absent. Every other test sees an empty data folder.")
    empty = tempfile.TemporaryDirectory(prefix="longmem-no-shared-data-")
    config.stash[_KEY] = (data_dir(), os.environ.get(DATA_ENV), empty)
    os.environ[DATA_ENV] = empty.name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for ``shared_data_dir`` reads the data too: it carries the mark (``-m shared_data`` lists
    every test that reads it)."""
    for item in items:
        if "shared_data_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(MARK)


def pytest_unconfigure(config: pytest.Config) -> None:
    real, before, empty = config.stash[_KEY]
    if before is None:
        os.environ.pop(DATA_ENV, None)
    else:
        os.environ[DATA_ENV] = before
    empty.cleanup()


def present(config: pytest.Config) -> Path:
    """The shared data folder the run was started with; the test asking is skipped, saying so, where it is absent."""
    real = config.stash[_KEY][0]
    if not (real / "MANIFEST.md").is_file():
        pytest.skip(f"the shared data folder is not here ({real}; ${DATA_ENV} names another)")
    return real


@pytest.fixture(scope="session")
def shared_data_dir(request: pytest.FixtureRequest) -> Path:
    """The shared data folder, for a test or fixture that reads a file of it by path (skipped where it is absent)."""
    return present(request.config)


@pytest.fixture(autouse=True)
def _shared_data_where_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``shared_data`` (whose code finds the folder itself, ``data_dir``) sees the real one."""
    if request.node.get_closest_marker(MARK) is not None:
        monkeypatch.setenv(DATA_ENV, str(present(request.config)))
