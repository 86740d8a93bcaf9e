"""Tiny GGUF files written in code with the ``gguf`` package (llama.cpp's own writer), as llama.cpp's converter lays
them out: a byte-level BPE tokenizer with a chat template, llama's q/k rows permuted for its RoPE, Qwen2's q/k/v
biases and untied output head. What transformers reads back from them is compared with the model they were made from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    symbol, extra = {}, 0
    for b in range(256):
        if b in keep:
            symbol[b] = chr(b)
        else:
            symbol[b] = chr(256 + extra)
            extra += 1
    return [symbol[b] for b in range(256)]


def vocabulary() -> list[str]:
    return _byte_symbols() + [m.replace(" ", "") for m in MERGES] + SPECIALS


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's row order for a llama q or k projection (transformers undoes it when it reads the file)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_gguf(path: Path, family: str = "llama", seed: int = 0, layers: int = 2, quant: str | None = None,
              hidden: int = 48) -> torch.nn.Module:
    """Write a tiny random ``family`` ("llama" or "qwen2") model to ``path`` as GGUF (float32 tensors; with
    ``quant``, e.g. "Q4_1", the projections whose inputs are a whole number of 32-weight blocks in that type, as
    llama.cpp's quantizer does); returns the Hugging Face model it was made from (float32 weights: a quantized file
    reads back as its dequantized weights, not these)."""
    import gguf

    torch.manual_seed(seed)
    tokens = vocabulary()
    qtype = getattr(gguf.GGMLQuantizationType, quant) if quant else None
    shape = dict(vocab_size=len(tokens), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                 num_attention_heads=hidden // 8, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
                 rms_norm_eps=1e-5, rope_theta=10000.0)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=False))
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    else:
        raise ValueError(f"no tiny GGUF for {family!r}")
    model = model.float().eval()
    sd = {k: v.detach() for k, v in model.state_dict().items()}

    w = gguf.GGUFWriter(str(path), family)
    w.add_name(f"tiny-{family}")
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(2 * hidden)
    w.add_head_count(hidden // 8)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(8)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS))  # normal, then control
    w.add_token_merges(MERGES)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 2)
    w.add_chat_template(CHAT_TEMPLATE)

    def put(name: str, t: torch.Tensor) -> None:
        data = t.numpy().astype(np.float32)
        if qtype is not None and data.ndim == 2 and data.shape[1] % 32 == 0 and name.startswith("blk."):
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    if family == "qwen2":
        put("output.weight", sd["lm_head.weight"])
    heads = {"q": hidden // 8, "k": 2}
    for i in range(layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        for a in "qkv":
            weight = sd[p + f"self_attn.{a}_proj.weight"]
            put(f"blk.{i}.attn_{a}.weight", _permute(weight, heads[a]) if family == "llama" and a in heads else weight)
            if family == "qwen2":
                put(f"blk.{i}.attn_{a}.bias", sd[p + f"self_attn.{a}_proj.bias"])
        put(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
