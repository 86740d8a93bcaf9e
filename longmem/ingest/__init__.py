"""Ingestion: reading untrusted files into text blocks under limits (``formats``, the registry of file formats;
``readers``, ``documents``, ``demofiles``, ``subtitles``, ``htmltext``, ``sandbox``, ``limits``) and the pipeline
that cuts them into segments and passages and stores them in a bank (``pipeline.ingest``, also
``longmem.ingest.ingest``).

Nothing is imported here eagerly: the extraction child (``sandbox``) imports this package without torch, and the
pipeline needs it."""


def __getattr__(name: str):
    if name == "ingest":  # the pipeline's entry point, loaded on first use
        from longmem.ingest.pipeline import ingest

        return ingest
    raise AttributeError(f"module 'longmem.ingest' has no attribute {name!r}")
