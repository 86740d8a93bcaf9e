"""The banks directory: persistent memory banks by name (create, open, list, rename, delete).

    <banks dir>/<name>/   one bank (see ``bank.py``: SQLite holds the truth, faiss index files are derived from it)

The banks directory defaults to ``<user data dir>/longmem/banks`` (``$LONGMEM_BANKS_DIR`` overrides it). Names are
plain, so a bank can never live outside the directory. Creating and deleting go through a temporary name and a
rename, so a killed process leaves a whole bank or none; its leftovers are swept later.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
import unicodedata
from pathlib import Path

import sqlite_utils

from longmem.storage.bank import KV_DTYPES, Bank
from longmem.storage.records import BankError, BankExists, UnknownBank
from longmem.storage.schema import migrate, now
from longmem.storage.writes import DB_NAME, LOCK_NAME

BANKS_ENV = "LONGMEM_BANKS_DIR"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def name_base(title: str) -> str:
    """What of ``title`` can name a bank: accents dropped, lower case, runs of other characters as one ``-``, at most
    56 characters, no separator at either end ("Les Misérables" -> "les-miserables"); "" when nothing is left (a
    title in another script)."""
    folded = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    base = re.sub(r"\.{2,}", ".", re.sub(r"[^a-z0-9._]+", "-", folded.lower()))
    return base.strip("-._")[:56].rstrip("-._")


def default_banks_dir() -> Path:
    env = os.environ.get(BANKS_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return platformdirs.user_data_path("longmem") / "banks"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BankDirectory:
    """The banks directory: create, open, list, rename and delete banks by name."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root).expanduser() if root is not None else default_banks_dir()

    def path(self, name: str) -> Path:
        """Directory of bank ``name``; names are plain (letters, digits, ``._-``), so they cannot leave the root."""
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or ".." in name:
            raise BankError(f"invalid bank name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a "
                            "letter or digit")
        path = self.root / name
        if path.resolve().parent != self.root.resolve():
            raise BankError(f"invalid bank name {name!r}: it would leave the banks directory {self.root}")
        return path

    def _sweep(self) -> None:
        """Remove what a killed process left behind: half-created or half-deleted bank directories."""
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            m = re.fullmatch(r"\.(.+)\.(creating|deleting)-(\d+)", p.name)
            if m and not _alive(int(m.group(3))):
                shutil.rmtree(p, ignore_errors=True)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / DB_NAME).is_file() and NAME_RE.fullmatch(p.name))

    def exists(self, name: str) -> bool:
        return (self.path(name) / DB_NAME).is_file()

    def free_name(self, title: str) -> str:
        """A valid bank name made from ``title`` (e.g. a book's title, or a file's name without its extension) that
        no bank has yet: ``name_base(title)``, "book" when that is empty, then ``-2``, ``-3``... if taken ("The Great
        Gatsby" -> "the-great-gatsby"). Taking it is the caller's (``create`` raises ``BankExists`` if another
        process took it meanwhile)."""
        base = name_base(title) or "book"
        for n in range(1, 10_000):
            name = base if n == 1 else f"{base}-{n}"
            if not self.path(name).exists():
                return name
        raise BankError(f"no free bank name left for {title!r}")

    def create(self, name: str, model, kv_dtype: str = "bfloat16") -> "Bank":
        """A new, empty bank for ``model`` (a ``SegmentLM`` with memory): its backbone, layer m, chunk size, segment
        length."""
        path = self.path(name)
        if path.exists():
            raise BankExists(f"bank {name!r} already exists ({path})")
        if kv_dtype not in KV_DTYPES:
            raise BankError(f"kv dtype must be one of {sorted(KV_DTYPES)}, got {kv_dtype!r}")
        if not model.uses_memory:
            raise BankError(f"{type(model).__name__} has no memory layer to build a bank for")
        spec, bb = model.backbone.spec, model.backbone
        self.root.mkdir(parents=True, exist_ok=True)
        self._sweep()
        tmp = self.root / f".{name}.creating-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            conn = sqlite3.connect(tmp / DB_NAME)
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # deleted documents give their pages back
            conn.execute("PRAGMA page_size = 65536")  # big pages: K/V blobs are ~1 MB per segment
            conn.execute("PRAGMA journal_mode = WAL")
            db = sqlite_utils.Database(conn)
            migrate(db)
            with db.atomic():
                db["bank"].insert({"id": 1, "name": name, "backbone_name": bb.name,
                                   "backbone_sha256": bb.fingerprint(), "cached_layer": model.cached_layer,
                                   "chunk_size": model.chunk_size, "n_kv_heads": spec.n_kv_heads,
                                   "head_dim": spec.head_dim, "segment_len": model.segment_len, "kv_dtype": kv_dtype,
                                   "epoch": 0, "created": now(), "updated": now()})
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
            (tmp / LOCK_NAME).touch()
            try:
                os.rename(tmp, path)  # fails if a bank of that name appeared meanwhile
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise BankExists(f"bank {name!r} already exists ({path})") from None
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.open(name)

    def open(self, name: str) -> "Bank":
        path = self.path(name)
        if not (path / DB_NAME).is_file():
            known = ", ".join(self.names()) or "none"
            raise UnknownBank(f"no bank named {name!r} in {self.root} (banks: {known})")
        return Bank(path)

    def delete(self, name: str) -> None:
        self._sweep()
        bank = self.open(name)
        try:
            with bank.writing():
                trash = self.root / f".{name}.deleting-{os.getpid()}"
                os.rename(bank.path, trash)  # the name is free at once; the files go next (or at the next sweep)
        finally:
            bank.close()
        shutil.rmtree(trash, ignore_errors=True)

    def rename(self, old: str, new: str) -> None:
        target = self.path(new)
        if target.exists():
            raise BankExists(f"bank {new!r} already exists ({target})")
        bank = self.open(old)
        try:
            with bank.writing():
                try:
                    os.rename(bank.path, target)  # the directory name is the bank's name; the row below follows it
                except OSError as e:
                    if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        raise BankExists(f"bank {new!r} already exists ({target})") from None
                    raise
                with bank.db.atomic():
                    bank.db["bank"].update(1, {"name": new, "updated": now()})
        finally:
            bank.close()

