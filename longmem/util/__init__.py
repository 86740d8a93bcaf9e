"""Layer 0, utilities every layer may use: atomic file writes (``files``) and the shared data folder (``data``).
No model, storage or UI code."""
