"""The backbone adapter against Hugging Face's own computations, on tiny llama (RoPE, GQA) and GPT-2 models."""

import copy

import pytest
import torch
from conftest import random_ids, tiny_gpt2, tiny_llama
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from longmem.model.backbone import BackboneError, resolve_dtype
from longmem.model.sidenet import SideLayer


def test_hidden_states_match_hf(backbone):
    ids = random_ids(12)
    out = backbone(ids)
    ref = backbone.model(ids, output_hidden_states=True)
    assert len(out.hidden) == backbone.spec.n_layers + 1
    for ours, theirs in zip(out.hidden[:-1], ref.hidden_states[:-1]):
        torch.testing.assert_close(ours, theirs)
    # HF's last hidden state has the final norm applied; ours is the raw residual stream
    torch.testing.assert_close(backbone.final_norm(out.hidden[-1]), ref.hidden_states[-1])
    torch.testing.assert_close(backbone.logits(out.hidden[-1]), ref.logits)


def test_stop_early_gives_same_prefix(backbone):
    ids = random_ids(10)
    full = backbone(ids).hidden
    part = backbone(ids, n_layers=2).hidden
    assert len(part) == 3
    for a, b in zip(part, full[:3]):
        torch.testing.assert_close(a, b)
    assert len(backbone.layers) == backbone.spec.n_layers  # layers restored after the truncated pass


def test_stop_before_first_layer(backbone):
    out = backbone(random_ids(5), n_layers=0)
    assert len(out.hidden) == 1 and out.hidden[0].shape == (1, 5, backbone.spec.hidden)


def test_layer_kv_is_pre_rope_projection():
    bb = tiny_llama()
    ids = random_ids(9)
    h = bb(ids).hidden
    layer = bb.layers[2]
    k, v = bb.layer_kv(2, h[2])
    x = layer.input_layernorm(h[2])
    ref_k = layer.self_attn.k_proj(x).view(1, 9, 2, 8).transpose(1, 2)
    ref_v = layer.self_attn.v_proj(x).view(1, 9, 2, 8).transpose(1, 2)
    torch.testing.assert_close(k, ref_k)
    torch.testing.assert_close(v, ref_v)
    assert k.shape == (1, bb.spec.n_kv_heads, 9, bb.spec.head_dim)


def test_rope_matches_hf():
    bb = tiny_llama()
    q, k = torch.randn(1, 6, 7, 8), torch.randn(1, 2, 7, 8)
    pos = torch.arange(3, 10)
    cos, sin = bb.model.model.rotary_emb(q, pos[None])
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q, ours_k = bb.rope(q, k, pos)
    torch.testing.assert_close(ours_q, ref_q)
    torch.testing.assert_close(ours_k, ref_k)


def test_gpt2_rope_is_identity():
    bb = tiny_gpt2()
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    assert bb.rope(q, k, torch.arange(5))[0] is q


def test_layer_ops_reproduce_hf_layer(backbone):
    """A SideLayer with open branches runs a copied layer exactly as Hugging Face runs the original."""
    ids = random_ids(11)
    h = backbone(ids).hidden
    layer = SideLayer(copy.deepcopy(backbone.layers[1]), backbone.ops, rezero=False)
    out = layer(h[1], rope=backbone.rope, positions=torch.arange(11))
    torch.testing.assert_close(out, h[2], atol=1e-5, rtol=1e-4)


def test_incremental_forward_with_cache_matches_full(backbone):
    ids = random_ids(10)
    full = backbone(ids).hidden
    first = backbone(ids[:, :6], positions=torch.arange(6), use_cache=True)
    second = backbone(ids[:, 6:], positions=torch.arange(6, 10), past_key_values=first.past_key_values,
                      use_cache=True)
    torch.testing.assert_close(second.hidden[-1], full[-1][:, 6:], atol=1e-5, rtol=1e-4)


def test_override_replaces_layer_output(backbone):
    ids = random_ids(6)
    out = backbone(ids, override=(1, lambda h_in: h_in))  # layer 1 becomes the identity
    ref = backbone(ids).hidden
    torch.testing.assert_close(out.hidden[2], ref[1])


def test_backbone_is_frozen_and_forward_has_no_grad(backbone):
    assert not any(p.requires_grad for p in backbone.parameters())
    assert not backbone(random_ids(4)).hidden[-1].requires_grad


def test_fingerprint_ignores_dtype_but_not_weights():
    a, b = tiny_llama(seed=0), tiny_llama(seed=0)
    b.model.to(torch.bfloat16)
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != tiny_llama(seed=1).fingerprint()


def test_unsupported_architecture_is_refused():
    from transformers import BertConfig, BertForMaskedLM

    from longmem.model.backbone import Backbone

    with pytest.raises(BackboneError, match="unsupported backbone"):
        Backbone(BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=32)))


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8")


def test_load_backbone_rejects_non_model_dir(tmp_path):
    from longmem.model.backbone import load_backbone

    with pytest.raises(BackboneError, match="nor a Hugging Face model directory"):
        load_backbone(str(tmp_path))


def test_keep_drops_unneeded_hidden_states(backbone):
    ids = random_ids(7)
    full = backbone(ids).hidden
    part = backbone(ids, keep={0, 2}).hidden
    assert len(part) == len(full)
    assert [i for i, h in enumerate(part) if h is not None] == [0, 2]
    torch.testing.assert_close(part[2], full[2])


def test_calls_from_two_threads_give_what_each_gives_alone(backbone):
    """The app's chats run beside its ingestion jobs, in other threads, on one backbone: a pass stopped at a layer
    (ingestion) and a whole pass (a chat) at the same time each return what they return alone, and the backbone
    keeps all its layers. (Before calls were serialised, a whole pass begun during a stopped one ran the shorter
    layer list, and could leave it in place.)"""
    import threading

    ids = random_ids(16)
    whole, stopped = backbone(ids).hidden, backbone(ids, n_layers=1).hidden
    stop, errors = threading.Event(), []

    def ingest_like():
        try:
            while not stop.is_set():
                out = backbone(ids, n_layers=1).hidden
                assert len(out) == 2 and torch.equal(out[1], stopped[1])
        except Exception as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)
            stop.set()

    t = threading.Thread(target=ingest_like)
    t.start()
    try:
        for _ in range(200):
            out = backbone(ids).hidden
            assert len(out) == len(whole) and torch.equal(out[-1], whole[-1])
            k, _ = backbone.layer_kv(backbone.spec.n_layers - 1, out[-2])  # the last layer, there between calls
            assert k.shape[-2] == ids.shape[1]
    finally:
        stop.set()
        t.join()
    assert not errors, errors[0]
    assert len(backbone.layers) == backbone.spec.n_layers
