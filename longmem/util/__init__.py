"""Layer 0, utilities every layer may use: atomic file writes (``files``), the shared data folder (``data``), figures
without pyplot (``plots``) and how a measuring command prints its result (``report``). No model, storage or UI code."""
