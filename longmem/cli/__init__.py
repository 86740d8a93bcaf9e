"""The command line: ``longmem`` (``main``), its bank commands (``bank``) and ``longmem eval`` (``eval``).
``longmem train`` runs the trainer found through the ``longmem.commands`` entry points."""
