"""Atomic directory writes."""

import pytest

from longmem.files import atomic_directory


def test_atomic_directory_replaces_whole(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("two")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary or old copies left behind


def test_failed_write_leaves_old_copy_untouched(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("half-written")
            raise RuntimeError("crash mid-write")
    assert (target / "a.txt").read_text() == "one"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
