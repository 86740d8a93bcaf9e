"""``training.studies.check_signals``: the AUC of a signal, a logistic regression scored book by book (never on its own
book's drafts), and the tally of what a user is shown, against the honesty a profile is held to."""

from __future__ import annotations

import pytest
import torch

from training.studies.check_signals import auc, book_by_book, tally


def test_auc_is_the_chance_a_right_draft_scores_above_a_wrong_one():
    assert auc([3, 4], [1, 2]) == 1.0 and auc([1], [2]) == 0.0
    assert auc([1, 2], [1, 2]) == 0.5  # ties count half
    assert auc([], [1]) != auc([], [1])  # nan: nothing to compare


def test_a_book_s_drafts_are_scored_by_a_model_of_the_other_books():
    torch.manual_seed(0)
    books = [b for b in "abc" for _ in range(20)]
    y = torch.tensor([i % 2 for i in range(60)], dtype=torch.float64)
    x = torch.stack([y * 2 - 1 + 0.3 * torch.randn(60, dtype=torch.float64), torch.randn(60, dtype=torch.float64)], 1)
    score = book_by_book(x, y, books)
    assert auc(score[y == 1].tolist(), score[y == 0].tolist()) > 0.95  # the first signal separates, in every book
    flipped = book_by_book(torch.cat([x[:20], -x[20:]]), y, books)  # book a's relation is the others' reversed
    assert auc(flipped[:20][y[:20] == 1].tolist(), flipped[:20][y[:20] == 0].tolist()) < 0.2
    relabelled = book_by_book(x, torch.cat([y[:20].flip(0), y[20:]]), books)  # book a's own labels never count
    assert torch.allclose(relabelled[:20], score[:20])


def test_the_tally_holds_a_reply_to_the_honesty_bound():
    rows = [{"golds": ("x",)}] * 3 + [{"golds": ()}] * 2
    o = tally(rows, ["right", "wrong", "not said", "not said", "wrong"])
    assert (o["right"], o["wrong"], o["said"], o["unanswerable"]) == (1, 2, 1, 2)
    assert o["wrong_pct"] == pytest.approx(40.0) and not o["honest"]
    assert tally(rows, ["right", "right", "not said", "not said", "not said"])["honest"]


def test_the_reader_s_hidden_state_is_read_after_each_draft_s_confirmation_question(tmp_path, monkeypatch):
    from tiny_gguf import tiny_gguf

    from training.studies.check_signals import hidden_states

    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(tmp_path / "cache"))  # the tiny reader's copy stays out of the user's
    reader = tmp_path / "tiny-qwen.gguf"
    tiny_gguf(reader, "qwen2", seed=3)
    rows = [{"question": "Who came to Gull Point?", "passages": ["Ann came at dawn.", "Bob left."], "draft": d}
            for d in ("Ann came.", "Bob did.")]
    states = hidden_states(rows, str(reader))
    assert states.shape[0] == 2 and states.dtype == torch.float64 and torch.isfinite(states).all()
    assert not torch.allclose(states[0], states[1])  # each draft's own state
    assert torch.allclose(hidden_states(rows[:1], str(reader))[0], states[0])  # one pass per draft, nothing carried


def test_the_best_threshold_keeps_the_most_right_within_the_honesty():
    from training.studies.check_signals import best_threshold

    table = [{"threshold": 0.1, "right": 9, "wrong": 5, "honest": False},
             {"threshold": 0.2, "right": 7, "wrong": 3, "honest": True},
             {"threshold": 0.3, "right": 7, "wrong": 2, "honest": True},
             {"threshold": 0.4, "right": 4, "wrong": 0, "honest": True}]
    assert best_threshold(table)["threshold"] == 0.3  # as many right, fewer wrong
    assert best_threshold(table[:1]) is None


def test_hidden_states_are_kept_in_the_run_folder_and_read_again(tmp_path, monkeypatch):
    import training.studies.check_signals as cs

    calls = []

    def states(rows, reader):
        calls.append(len(rows))
        return torch.arange(len(rows) * 3, dtype=torch.float64).view(len(rows), 3)

    monkeypatch.setattr(cs, "hidden_states", states)
    rows = [{"id": f"b:q{i}", "draft": f"d{i}"} for i in range(3)]
    first = cs.cached_states(tmp_path, rows, "/models/tiny.gguf")
    assert (tmp_path / "hidden.tiny.gguf.safetensors").is_file()
    again = cs.cached_states(tmp_path, rows[::-1], "/models/tiny.gguf")  # any order, from the file
    assert calls == [3] and torch.equal(again, first.flip(0))
    changed = [dict(rows[0], draft="another"), *rows[1:]]  # a draft not kept: read again
    cs.cached_states(tmp_path, changed, "/models/tiny.gguf")
    assert calls == [3, 3]
