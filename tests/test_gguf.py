"""Bring your own model as a GGUF file: converted once to safetensors in the cache (keyed by the file's size and
SHA-256), read back as the model it was made from (llama, whose q/k rows llama.cpp permutes, and Qwen2, with q/k/v
biases and an untied head), and refused clearly when it is not one. Tiny GGUF files written in code (``tiny_gguf``)."""

from __future__ import annotations

import pytest
import torch
from tiny import small_config
from tiny_gguf import tiny_gguf

from longmem.cli.main import main
from longmem.model.backbone import BackboneError, gguf_backbone_dir, known_backbones, load_backbone
from longmem.model.longmem import LongMemModel


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_gguf_file_loads_as_the_model_it_was_made_from(family, tmp_path):
    path = tmp_path / f"tiny-{family}.gguf"
    reference = tiny_gguf(path, family)
    bb = load_backbone(str(path), "float32")
    assert bb.name == f"tiny-{family}" and bb.family == "llama" and bb.model.config.model_type == family
    ids = torch.randint(0, reference.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(bb.model(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-5)
    assert bb.tokenizer.decode(bb.tokenizer("the harbour", add_special_tokens=False).input_ids) == "the harbour"
    chat = bb.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                            tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # the file's own chat template
    untrained = LongMemModel(bb, small_config(segment_len=32))
    torch.testing.assert_close(untrained(ids, untrained.new_memory()).logits, bb.model(ids).logits)


def test_a_gguf_is_converted_once_and_again_when_it_changes(tmp_path, cache, monkeypatch):
    path = tmp_path / "mine.gguf"
    tiny_gguf(path, "llama", seed=0)
    first = gguf_backbone_dir(path)
    assert first.parent == cache / "backbones" and (first / "config.json").exists()
    monkeypatch.setattr("longmem.model.backbone._materialise", lambda *a: pytest.fail("converted twice"))
    assert gguf_backbone_dir(path) == first
    monkeypatch.undo()
    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(cache))
    tiny_gguf(path, "llama", seed=1)  # the same name, other weights
    second = gguf_backbone_dir(path)
    assert second != first and load_backbone(str(path), "float32").fingerprint() != \
        load_backbone(str(first), "float32").fingerprint()


def test_a_file_that_is_not_a_gguf_model_is_refused_clearly(tmp_path, cache):
    with pytest.raises(BackboneError, match="no such GGUF file"):
        load_backbone(str(tmp_path / "missing.gguf"))
    (tmp_path / "notes.gguf").write_text("these are my notes")
    with pytest.raises(BackboneError, match="notes.gguf is not a GGUF file"):
        load_backbone(str(tmp_path / "notes.gguf"))
    whole = tmp_path / "whole.gguf"
    tiny_gguf(whole, "llama")
    (tmp_path / "cut.gguf").write_bytes(whole.read_bytes()[:2000])  # a download cut short
    with pytest.raises(BackboneError, match="cut.gguf could not be read as a GGUF causal language model"):
        load_backbone(str(tmp_path / "cut.gguf"))
    assert not list(cache.rglob("cut*"))  # nothing half-written kept


def test_longmem_chat_answers_from_a_gguf_backbone(tmp_path, capsys):
    path = tmp_path / "tiny-qwen2.gguf"
    tiny_gguf(path, "qwen2")
    book = tmp_path / "story.txt"
    book.write_text("The keeper of the lighthouse was Ada Quill. A silver zeppelin drifted over the harbour. " * 12)
    code = main(["chat", "--backbone", str(path), "--file", str(book), "--ask", "Who kept the lighthouse?",
                 "--max-new-tokens", "8", "--dtype", "float32"])
    out = capsys.readouterr().out
    assert code == 0 and "> Who kept the lighthouse?" in out and "[1] story" in out


def test_the_workspace_loads_a_gguf_lists_it_and_answers_from_a_bank_built_with_it(tmp_path):
    from tiny import chat_model

    from longmem.service import Settings, Workspace
    from longmem.storage import BankDirectory

    path = tmp_path / "tiny-qwen2.gguf"
    tiny_gguf(path, "qwen2")
    book = tmp_path / "story.txt"
    book.write_text("The keeper of the lighthouse was Ada Quill. A silver zeppelin drifted over the harbour. " * 12)
    ws = Workspace(chat_model(segment_len=64), BankDirectory(tmp_path / "banks"), work_dir=tmp_path / "work",
                   dtype="float32")
    try:
        assert ws.known_models() == ["default"]
        info = ws.load_model(str(path))
        assert info["backbone"] == "tiny-qwen2" and info["sidenet"].startswith("untrained")
        assert ws.known_models() == ["default", str(path.resolve())]
        state = ws.jobs.wait(ws.ingest("story", [book], create=True), timeout=120)
        assert state.status == "done", state.message
        reply = ws.chat("story", "Who kept the lighthouse?", Settings(max_new_tokens=8))
        assert "".join(reply) and reply.citations and "lighthouse" in reply.citations[0].text
    finally:
        ws.close()


def test_a_bfloat16_run_converts_a_bfloat16_copy_with_the_float32_copys_weights(tmp_path, cache):
    """A model run in bfloat16 reads a bfloat16 copy of its GGUF file (half the memory to convert and load): its
    weights are the float32 copy's rounded to bfloat16, bit for bit, so both dtypes answer as before."""
    path = tmp_path / "tiny-qwen2.gguf"
    tiny_gguf(path, "qwen2")
    half, full = load_backbone(str(path), "bfloat16"), load_backbone(str(path), "float32")
    assert gguf_backbone_dir(path, dtype=torch.bfloat16).name.endswith("-bfloat16")
    assert gguf_backbone_dir(path, dtype=torch.float32) != gguf_backbone_dir(path, dtype=torch.bfloat16)
    want = {k: t.to(torch.bfloat16) for k, t in full.model.state_dict().items()}
    got = half.model.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert half.fingerprint() == full.fingerprint()  # one backbone, whatever dtype it was loaded in
    assert known_backbones().count(str(path)) == 1  # one model, offered once
