"""The data guard (``tests/data_guard.py``): a test runs as on a fresh clone with no shared data unless it says it
reads the data, so a test that reads it without saying so fails wherever it runs, CI included (issue 91)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

READS_UNMARKED = """
from longmem.util.data import data_dir

def test_reads_the_manifest():
    assert (data_dir() / "MANIFEST.md").read_text()
"""

READS_MARKED = """
import pytest
from longmem.util.data import data_dir

@pytest.mark.shared_data
def test_reads_the_manifest():
    assert (data_dir() / "MANIFEST.md").read_text()

def test_reads_by_path(shared_data_dir):
    assert (shared_data_dir / "MANIFEST.md").read_text()
"""


@pytest.fixture
def fake_data(tmp_path, monkeypatch) -> Path:
    """A shared data folder holding only its MANIFEST.md, named as the run's data folder."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "MANIFEST.md").write_text("# data\n")
    monkeypatch.setenv("LONGMEM_DATA_DIR", str(data))
    return data


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(source)
    return pytester.runpytest_subprocess("-p", "data_guard", "-p", "no:cacheprovider", *args)


@pytest.fixture
def guarded(pytester, monkeypatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the plugin, importable in the child pytest
    return pytester


@pytest.mark.heavy
def test_a_test_that_reads_the_data_without_the_mark_fails_even_where_the_data_is(guarded, fake_data):
    result = run(guarded, READS_UNMARKED)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*MANIFEST.md*"])


@pytest.mark.heavy
def test_a_marked_test_reads_the_real_folder_and_is_skipped_saying_so_where_there_is_none(guarded, fake_data,
                                                                                        tmp_path):
    run(guarded, READS_MARKED).assert_outcomes(passed=2)
    (fake_data / "MANIFEST.md").unlink()
    result = run(guarded, READS_MARKED, "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*the shared data folder is not here*"])


@pytest.mark.heavy
def test_a_test_asking_for_the_folder_by_path_carries_the_mark(guarded, fake_data):
    """``-m shared_data`` lists every test that reads the data: CI runs them once more with the data hidden."""
    run(guarded, READS_MARKED, "-m", "shared_data").assert_outcomes(passed=2)
    run(guarded, READS_MARKED, "-m", "not shared_data").assert_outcomes(deselected=2)


def test_no_test_names_the_shared_folder_by_a_path_of_its_own():
    """A path built to ``../shared/data`` would read the data behind the guard's back: only the guard finds it."""
    built = re.compile(r"""["']shared["']\s*/|/shared/data|shared/data/|parents\[2\]""")
    offenders = [f"{p.name}:{n}" for p in sorted(TESTS.glob("test_*.py")) if p != Path(__file__)
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if built.search(line)]
    assert not offenders, offenders
