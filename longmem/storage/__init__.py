"""Storage: what is kept on disk. A ``Bank`` is one persistent memory bank (SQLite via sqlite-utils for
documents, segments, passages and their FTS5 index; faiss index files beside it); the ``BankDirectory`` is the
directory of banks (create, open, rename, delete, locks). Imports the in-RAM memory and text layers, never model
code above them.
"""

from longmem.storage.bank import KV_DTYPES, Bank
from longmem.storage.directory import BankDirectory
from longmem.storage.records import (
                                     BankBusy,
                                     BankCorrupt,
                                     BankError,
                                     BankExists,
                                     BankInfo,
                                     BankMismatch,
                                     ChunkText,
                                     Document,
                                     UnknownBank,
                                     VerifyReport,
)
from longmem.storage.writes import DB_NAME, LOCK_NAME

__all__ = ["DB_NAME", "KV_DTYPES", "LOCK_NAME", "Bank", "BankBusy", "BankCorrupt", "BankError", "BankExists",
           "BankInfo", "BankMismatch", "ChunkText", "Document", "BankDirectory", "UnknownBank", "VerifyReport"]
