"""Tiny random backbones built in code (llama with RoPE + GQA, Qwen2 with q/k/v biases and untied embeddings, GPT-2)
and a character tokenizer for them.

Importable on its own (not only through conftest) so that subprocess-based tests can build the same models.
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from longmem.model.backbone import Backbone
from longmem.model.longmem import LongMemConfig, LongMemModel

VOCAB = 97  # <unk>, the 95 printable ASCII characters and "\n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (with offsets, like any fast tokenizer); anything outside ASCII is <unk>."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<unk>": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def tiny_llama(n_layers: int = 4, seed: int = 0, dtype: torch.dtype = torch.float32) -> Backbone:
    """The same random weights for a seed in any dtype (made in float32, then cast)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=n_layers,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      tie_word_embeddings=True)
    return Backbone(LlamaForCausalLM(cfg).float().to(dtype), tokenizer=char_tokenizer(), name=f"tiny-llama-{n_layers}")


def tiny_qwen2(n_layers: int = 4, seed: int = 0, dtype: torch.dtype = torch.float32) -> Backbone:
    """Qwen2: biases on the q/k/v projections (random here, so that a path that drops them shows) and an output head
    of its own (untied embeddings)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=n_layers,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return Backbone(model.to(dtype), tokenizer=char_tokenizer(), name=f"tiny-qwen2-{n_layers}")


FAMILIES = {"llama": tiny_llama, "qwen2": tiny_qwen2}  # and "gpt2" (tiny_gpt2, below)


def tiny_gpt2(n_layers: int = 4, seed: int = 0, dtype: torch.dtype = torch.float32) -> Backbone:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=n_layers, n_head=4, n_positions=256,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return Backbone(GPT2LMHeadModel(cfg).float().to(dtype), tokenizer=char_tokenizer(), name=f"tiny-gpt2-{n_layers}")


def small_config(**kw) -> LongMemConfig:
    base = dict(dtype="float32", chunk_size=2, topk=8, capacity=None, segment_len=16)
    base.update(kw)
    return LongMemConfig(**base)


def tiny_backbone(family: str = "llama", dtype: torch.dtype = torch.float32, seed: int = 0) -> Backbone:
    return {**FAMILIES, "gpt2": tiny_gpt2}[family](seed=seed, dtype=dtype)


def tiny_model(family: str = "llama", dtype: torch.dtype = torch.float32, **config) -> LongMemModel:
    return LongMemModel(tiny_backbone(family, dtype), small_config(**config))


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def chat_model(seed: int = 0, segment_len: int = 64, dtype: torch.dtype = torch.float32) -> LongMemModel:
    """A tiny llama whose tokenizer has a chat template, with a window big enough for a short conversation."""
    backbone = tiny_llama(seed=seed, dtype=dtype)
    backbone.tokenizer.chat_template = CHAT_TEMPLATE
    return LongMemModel(backbone, small_config(segment_len=segment_len, chunk_size=2))
