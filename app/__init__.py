"""The LongMem web app (Gradio). Thin: every handler calls ``longmem.service.workspace.Workspace``; see ``app.main``."""
