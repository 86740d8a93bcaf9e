"""Two runs of an item-scored suite paired item by item (``longmem eval compare``): the sign test by hand, the pairs
on made-up results, and the command on two folders."""

from __future__ import annotations

import gzip
import json

import pytest

from longmem.cli.eval import main
from longmem.eval.compare import Paired, discordant, paired, sign_test
from longmem.eval.core import SuiteResult


def result(suite: str, answers: dict[str, dict[str, list[int]]]) -> SuiteResult:
    """A suite result whose entrants answered items q0, q1, ... of each cell as ``answers`` says (1: answered)."""
    results = {e: {cell: {"contains": 100 * sum(xs) / len(xs), "items": [{"id": f"q{i}", "contains": float(x)}
                                                                         for i, x in enumerate(xs)]}
                       for cell, xs in cells.items()} for e, cells in answers.items()}
    return SuiteResult(suite, "t", [], {"results": results, "models": {"oracle": "the oracle"}}, {})


def test_the_sign_test_by_hand():
    assert sign_test(3, 1) == pytest.approx(2 * (1 + 4) / 16)  # 0.625
    assert sign_test(0, 6) == pytest.approx(2 / 64)
    assert sign_test(1, 3) == sign_test(3, 1)
    assert sign_test(0, 0) == 1.0 and sign_test(2, 2) == 1.0


def test_discordant_counts_the_items_answered_by_one_side_only():
    assert discordant([1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]) == (1, 2)


def test_entrants_are_paired_on_the_items_both_runs_answered():
    a = result("bookqa", {"oracle": {"4096": [1, 1, 0, 0], "16384": [1, 0]}, "rag_bm25": {"4096": [1, 0, 0, 0]}})
    b = result("bookqa", {"oracle": {"4096": [1, 0, 1, 1]}, "longmem": {"4096": [1, 1, 1, 1]}})
    assert paired(a, b) == [Paired("oracle", 4, 2, 3, 1, 2)]  # 16384 is A's alone; rag_bm25 and longmem one run's
    assert paired(a, b)[0].p == pytest.approx(1.0)


def test_a_total_cell_is_not_counted_twice():
    per_book = {"book-a": [1, 0], "book-b": [0, 1]}
    a = result("natural", {"oracle": {**per_book, "all": [1, 0, 0, 1]}})
    b = result("natural", {"oracle": {"book-a": [0, 0], "book-b": [0, 1], "all": [0, 0, 0, 1]}})
    assert paired(a, b) == [Paired("oracle", 4, 2, 1, 1, 0)]


def test_results_of_other_suites_are_refused():
    with pytest.raises(ValueError, match="cannot pair"):
        paired(result("bookqa", {}), result("facts", {}))
    with pytest.raises(ValueError, match="not scored item by item"):
        paired(result("icl", {}), result("icl", {}))


def test_the_command_prints_a_table_per_suite_both_folders_hold(tmp_path, capsys):
    for name, xs in [("a", [1, 1, 1, 0]), ("b", [0, 0, 1, 0])]:
        (tmp_path / name).mkdir()
        text = json.dumps(result("facts", {"oracle": {"4096": xs}}).to_json())
        if name == "a":  # a run's folder
            (tmp_path / name / "facts.json").write_text(text)
        else:  # a results document's folder: its copies are gzipped
            (tmp_path / name / "facts.json.gz").write_bytes(gzip.compress(text.encode()))
    assert main(["compare", "--out", str(tmp_path / "a"), "--against", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "### facts" in out and "| the oracle | 4 | 3 | 1 | 2 / 0 | 0.50 |" in out
    assert main(["compare", "--out", str(tmp_path / "a")]) == 2  # no --against
    assert main(["compare", "--out", str(tmp_path / "a"), "--against", str(tmp_path / "none")]) == 2
    assert "no result of the same item-scored suite" in capsys.readouterr().err
