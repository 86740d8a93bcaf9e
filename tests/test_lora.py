"""LoRA wrappers: inference multiplies by the merged weight, made again whenever what it was made from changes;
training keeps the separate low-rank path and its gradients."""

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from longmem.model.lora import LoRA

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def _wrapped(kind: str, dtype: torch.dtype) -> LoRA:
    torch.manual_seed(0)
    base = nn.Linear(12, 8) if kind == "linear" else Conv1D(8, 12)  # GPT-2's Conv1D stores its weight (in, out)
    if kind == "conv1d":
        nn.init.normal_(base.weight, std=0.3)
        nn.init.normal_(base.bias, std=0.3)
    lora = LoRA(base.to(dtype), rank=4)
    with torch.no_grad():
        lora.lora_b.normal_(0, 0.5)  # a trained update (B starts at zero)
    return lora


def _separate(lora: LoRA, x: torch.Tensor) -> torch.Tensor:
    lora.train()
    with torch.no_grad():
        out = lora(x)
    lora.eval()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_inference_with_the_merged_weight_matches_the_separate_update(kind, dtype):
    lora = _wrapped(kind, dtype).eval()
    x = torch.randn(3, 5, 12).to(dtype)
    with torch.no_grad():
        merged = lora(x)
    assert merged.dtype == dtype and lora._merged is not None
    torch.testing.assert_close(merged.float(), _separate(lora, x).float(), **TOL[dtype])


def test_the_merged_weight_is_made_again_when_a_factor_or_the_base_changes():
    lora = _wrapped("linear", torch.float32).eval()
    x = torch.randn(2, 12)
    with torch.no_grad():
        before = lora(x)
        first = lora.merged_weight()
        assert lora.merged_weight() is first  # kept while nothing changed
        lora.lora_a.add_(0.1)  # as an optimizer step changes it, in place
        after = lora(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, _separate(lora, x), **TOL[torch.float32])
    lora.to(torch.float64)  # replaced tensors (a move or a cast)
    assert lora._merged is None
    with torch.no_grad():
        assert lora.merged_weight().dtype == torch.float64
    lora.train()  # a fused optimizer's step changes the factors without counting: the switch of mode drops it
    assert lora._merged is None


def test_training_keeps_the_separate_path_and_its_gradients():
    lora = _wrapped("linear", torch.float32).train()
    lora(torch.randn(2, 12)).sum().backward()
    assert lora.lora_a.grad is not None and lora.lora_b.grad is not None and lora._merged is None
    lora.eval()  # eval mode with gradients on (a score that backpropagates) is not inference either
    lora(torch.randn(2, 12)).sum().backward()
    assert lora._merged is None
