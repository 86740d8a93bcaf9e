"""The LongMem web app (Gradio). UI only: every handler calls the longmem library."""
