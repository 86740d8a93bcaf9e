"""Utilities every layer may use: atomic file writes (``files``), the shared data folder (``data``), figures
without pyplot (``plots``), how a measuring command prints its result (``report``) and the old names of
renamed settings (``names``). No model, storage or UI code."""
