"""What the app keeps in a bank beside its memory: the bank's chat conversation (with the passages each answer read)
and the classifiers saved with it (their JSON specs). A part of ``Bank``: each write is one transaction of the
bank's own SQLite database (``self.db``). These small rows do not take the bank's writer lock: SQLite serialises
them with an ingestion's writes, so a chat can go on while a book is being ingested."""

from __future__ import annotations

import json

from longmem.storage.records import BankError
from longmem.storage.schema import now
from longmem.util.names import current_names


class AppRecords:
    """Chat turns and classifier specs of a bank; mixed into ``Bank``, which provides ``db``."""

    db: object  # the bank's sqlite_utils.Database

    def chat_turns(self, passages: bool = False) -> list[dict]:
        """The bank's conversation, oldest first: [{"role": "user"|"assistant", "content": str}, ...] (with
        ``passages``, each turn also has "passages": the JSON-able list stored with it)."""
        rows = self.db.query("SELECT role, content, passages FROM chat_turns ORDER BY id")
        return [{"role": r["role"], "content": r["content"], **({"passages": json.loads(r["passages"])}
                                                                 if passages else {})} for r in rows]

    def add_chat_turns(self, turns: list[dict]) -> None:
        """Append a question and its answer together (one transaction, so a conversation never ends mid-turn); a
        turn may carry "passages" (a JSON-able list, e.g. what memory retrieved for the answer)."""
        with self.db.atomic():
            for t in turns:
                self.db["chat_turns"].insert({"role": t["role"], "content": t["content"],
                                              "passages": json.dumps(t.get("passages", [])), "created": now()})

    def clear_chat(self) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM chat_turns")

    def save_classifier(self, name: str, spec: dict) -> None:
        """Store (or replace) a classifier's JSON spec under ``name``."""
        if not name.strip():
            raise BankError("a classifier needs a name")
        with self.db.atomic():
            old = list(self.db.query("SELECT created FROM classifiers WHERE name = ?", [name]))
            self.db["classifiers"].upsert({"name": name, "spec": json.dumps(spec), "updated": now(),
                                           "created": old[0]["created"] if old else now()}, pk="name")

    def save_classifier_head(self, name: str, head: bytes | None) -> None:
        """Store (or, with None, drop) the fitted head of saved classifier ``name``."""
        with self.db.atomic():
            if not list(self.db.query("SELECT 1 FROM classifiers WHERE name = ?", [name])):
                raise BankError(f"no classifier {name!r} to store a head for")
            self.db.execute("UPDATE classifiers SET head = ?, updated = ? WHERE name = ?", [head, now(), name])

    def classifier_head(self, name: str) -> bytes | None:
        """The stored head of classifier ``name`` (None: none fitted yet, or no such classifier)."""
        rows = list(self.db.query("SELECT head FROM classifiers WHERE name = ?", [name]))
        return rows[0]["head"] if rows else None

    def classifiers(self) -> dict[str, dict]:
        """Saved classifiers by name (settings renamed since they were saved under their current names)."""
        rows = self.db.query("SELECT name, spec FROM classifiers ORDER BY name")
        return {r["name"]: current_names(json.loads(r["spec"])) for r in rows}

    def delete_classifier(self, name: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM classifiers WHERE name = ?", [name])
