"""The evaluation's data: the books corpus and its train/test split (``books``), synthetic long-range recall items
and training documents (``recall``), and SQuAD (``squad``)."""
