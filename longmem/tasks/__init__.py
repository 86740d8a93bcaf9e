"""What a user does with a model and a bank: chat and continuation (``chat``), finding and reading passages
(``reading``), answering with citations or saying the book does not say (``answer``, ``evidence``), classification
(``classify``, ``examples``, ``measure``) and the demonstrations a classifier finds in its bank (``demos``)."""
