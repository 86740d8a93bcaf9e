"""The LongMem web app (Gradio). Thin: every handler calls ``longmem.service.Workspace``; see ``app.main``."""
