"""Layer 7, what the app calls: the ``Workspace`` (banks, background jobs, chat sessions; ``workspace``), its job
queue (``jobs``) and its classifier builder (``classifier_builder``). No UI code: ``app/`` is the only Gradio."""
