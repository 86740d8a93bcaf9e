"""Two runs of a suite on the same items, compared item by item: ``longmem eval compare --out A --against B``.

For the suites whose answers are scored one item at a time (``bookqa``, ``facts``, ``natural``: each entrant's
``results[entrant][cell]["items"]``, an item an ``id`` with a ``contains`` score of 0 or 1), every entrant that both
runs have is paired on the items both answered (the same id in the same cell: a distance, a book). A difference
between two runs is read from the discordant items (answered by one run only), with a two-sided sign test: the
record's rule that one or two items are not a finding, made a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from longmem.eval.core import SuiteResult, table

PAIRED_SUITES = ("bookqa", "facts", "natural")
TOTAL_CELL = "all"  # natural's union of its books: the items are counted in their own cells


@dataclass(frozen=True)
class Paired:
    entrant: str
    items: int  # items both runs answered
    a: int  # answered (containing a gold answer) by run A
    b: int
    only_a: int  # discordant items: answered by A and not B
    only_b: int

    @property
    def p(self) -> float:
        """Two-sided sign test on the discordant items (1.0 when there are none)."""
        return sign_test(self.only_a, self.only_b)


def sign_test(x: int, y: int) -> float:
    """Two-sided exact binomial test of x successes against y at p = 1/2."""
    n = x + y
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(x, y) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def discordant(a: list[float], b: list[float]) -> tuple[int, int]:
    """Of two score lists over the same items (> 0: answered), the items answered only in ``a``, and only in ``b``."""
    return sum(x > 0 and not y > 0 for x, y in zip(a, b)), sum(y > 0 and not x > 0 for x, y in zip(a, b))


def scores(result: SuiteResult) -> dict[str, dict[tuple[str, str], float]]:
    """entrant -> {(cell, item id): contains} from a suite result."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    for entrant, cells in result.data.get("results", {}).items():
        own = [c for c in cells if c != TOTAL_CELL] or list(cells)
        out[entrant] = {(c, item["id"]): float(item["contains"]) for c in own for item in cells[c].get("items", [])}
    return out


def paired(a: SuiteResult, b: SuiteResult) -> list[Paired]:
    """Each entrant both results have, paired on their shared items (entrants in A's order)."""
    if a.suite != b.suite:
        raise ValueError(f"cannot pair a {a.suite} result with a {b.suite} result")
    if a.suite not in PAIRED_SUITES:
        raise ValueError(f"{a.suite} is not scored item by item; pairs are made for {', '.join(PAIRED_SUITES)}")
    sa, sb = scores(a), scores(b)
    rows = []
    for entrant in (e for e in sa if e in sb):
        shared = sorted(sa[entrant].keys() & sb[entrant].keys())
        xa, xb = [sa[entrant][k] for k in shared], [sb[entrant][k] for k in shared]
        rows.append(Paired(entrant, len(shared), sum(x > 0 for x in xa), sum(x > 0 for x in xb), *discordant(xa, xb)))
    return rows


def markdown(a: SuiteResult, b: SuiteResult, name_a: str, name_b: str) -> str:
    """The pairs as a markdown table, with the entrants' labels where the result has them."""
    labels = a.data.get("models", {})
    rows = [[labels.get(r.entrant, r.entrant), str(r.items), str(r.a), str(r.b), f"{r.only_a} / {r.only_b}",
             f"{r.p:.2f}"] for r in paired(a, b)]
    head = ["entrant", "items", f"answered: {name_a}", f"answered: {name_b}", "only A / only B", "sign test p"]
    return f"### {a.suite}: A = {name_a}, B = {name_b}\n\n{table(head, rows)}"
