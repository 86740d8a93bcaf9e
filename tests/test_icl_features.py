"""``training.studies.icl_features``: a reader's state and label-word log-probabilities at each text's last prompt
token."""

from __future__ import annotations

import numpy as np


def test_a_reader_s_features_are_read_at_the_text_s_last_prompt_token(tmp_path, monkeypatch):
    from tiny_gguf import tiny_gguf

    from training.studies.icl_features import reader_features

    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(tmp_path / "cache"))
    reader = tmp_path / "tiny-llama.gguf"
    tiny_gguf(reader, "llama", seed=2)
    texts = ["a warm film", "a cold film", "a warm film"]
    states, words = reader_features(str(reader), "Review: {text} Sentiment: {label}", ["positive", "negative"], texts)
    assert states.shape[0] == 3 and words.shape == (3, 2) and states.dtype == np.float64
    assert np.allclose(states[0], states[2]) and not np.allclose(states[0], states[1])  # each text's own state
    assert (words <= 0).all()  # log-probabilities
