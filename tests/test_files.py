"""Atomic directory and file writes."""

import pytest

from longmem.util.files import atomic_directory, write_file_atomic


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


def test_write_file_atomic_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "results.md"
    write_file_atomic(target, b"one")
    write_file_atomic(target, memoryview(b"two, longer"))
    assert target.read_bytes() == b"two, longer" and [p.name for p in tmp_path.iterdir()] == ["results.md"]
    assert target.stat().st_mode & 0o777 == 0o644


def test_write_file_atomic_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "results.md"
    write_file_atomic(target, b"old")
    with pytest.raises(TypeError):
        write_file_atomic(target, "not bytes")  # fails inside the write, after the temporary file exists
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["results.md"]
