"""Benchmarks: scripts that print JSON and a markdown table (``python -m longmem.bench.inference``,
``.bank``, ``.dtypes``, ``.extract``), and the machine facts every record states (``inference.machine_facts``)."""
