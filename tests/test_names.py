"""Renamed settings: files written under an old name are read under the current one."""

from __future__ import annotations

from longmem.util.names import current_names


def test_an_old_name_is_read_under_the_current_one():
    assert current_names({"csz": 2, "topk": 8}) == {"chunk_size": 2, "topk": 8}


def test_a_current_name_wins_over_an_old_one_and_others_pass_through():
    assert current_names({"csz": 2, "chunk_size": 4}) == {"chunk_size": 4}
    assert current_names({"size": {"csz": 2}}) == {"size": {"csz": 2}}  # one level deep: nested dicts are the caller's
    assert current_names({}) == {}
