"""Studies: measurements that chose a setting (or chose against building something), kept so each can be re-run.
A study ships nothing: no checkpoint, no data set, nothing the library or the app reads. Its figures are recorded in
the docs (``docs/design.md``, ``docs/runs/``, ``docs/history/``), each beside the choice it informed; the training
that ships something is the rest of ``training/``. Each runs as ``python -m training.studies.NAME``.

- ``probe``: where retrieval finds a fact in memory and which heads could copy it: the backbone layer cached in
  memory (layer 18, ``--cached-layer``), attention sinks left out of the search (``max_sinks = 0``), and why names
  were not recalled (hence the training names from no list and ``--quote-docs``); ``docs/runs/probe/``.
- ``reading_coverage``: how often the evidence lies whole in what the reader is handed, per way of choosing it: spans
  read found passages first, then neighbours (``tasks.spans.widen``), and a passage's names of the passage before it
  are not built into the bank (``text.names``); ``docs/design.md``, "How a larger reader reads".
- ``check_signals``: how well each signal of a reader's draft tells right from wrong: the reader's own confirmation
  (``Reading.confirm``) and a probe of its hidden state were measured, not shipped (issue 85 blocked on a reader that
  judges its drafts); ``docs/design.md``, "The reader's own confirmation, and every signal together".
- ``pool_ceiling``: how much a second finder would widen the app's candidates: none was added (issue 70 blocked on
  passages that share no words with their question); ``docs/design.md``, "Finding is measured on its own".
- ``icl_features``: which features a classifier's readout should read: the head reads the backbone's last state
  stacked with the MiniLM sentence embedding, and no memory (``tasks.head``); ``docs/design.md``, "The classifier
  decides with a head fitted on its examples".
- ``heldout_classify``: the held-out check of that head as a user runs it, after the choice (it chose nothing: it
  tells whether the choice made on the dev splits holds); ``docs/design.md``, the same section.
"""
