"""Layer 6, what a user does with a model and a bank: chat and continuation (``chat``), finding and reading passages
(``reading``), classification (``classifiers``: examples, specs, evaluation, curves) and the demonstrations a
classifier finds in its bank (``demos``)."""
