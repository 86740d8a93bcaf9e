"""The LongMem web app (Gradio). Thin: every handler calls ``longmem.workspace.Workspace``; see ``app.main``."""
