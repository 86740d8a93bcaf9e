"""The paper's evaluation, reproduced on our backbone: ``longmem eval <suite>`` (see ``longmem.cli.eval``).

Each suite is a module with ``run(ctx) -> SuiteResult``; ``SUITES`` names them in the order ``all`` runs them.
"""

SUITES = {  # name -> module (imported when the suite runs)
    "books": "longmem.eval.books",  # 1. long-context language modelling (paper table 3)
    "chapterbreak": "longmem.eval.chapterbreak",  # 2. suffix identification (table 4)
    "icl": "longmem.eval.icl",  # 3. memory-augmented in-context learning (table 5)
    "squad": "longmem.eval.squad",  # 4. open-ended ICL on SQuAD (table 6)
    "efficiency": "longmem.eval.efficiency",  # 5. speed and memory (appendix)
    "ablations": "longmem.eval.ablations",  # 6. chunk size and memory size (figure 4)
    "recall": "longmem.eval.recall",  # 7. long-range recall by distance (beyond the paper)
    "bookqa": "longmem.eval.bookqa",  # 8. questions about a long text, read and cited (beyond the paper)
    "natural": "longmem.eval.natural",  # 9. natural questions about whole books (beyond the paper)
    "facts": "longmem.eval.facts",  # 10. facts at a distance, asked as a reader asks, to 1M tokens (beyond the paper)
    "finding": "longmem.eval.finding",  # 11. where each finder ranks the gold passage (beyond the paper)
}
