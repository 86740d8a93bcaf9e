"""One token's projections as matrix-vector products (``longmem.model.linear``): what ``F.linear`` gives (the same
bits on the CPU measured; compared here within bfloat16 rounding, as another CPU's kernels may sum in another
order), taken only for one bfloat16 row on the CPU, and put in place inside every backbone family without changing
what it computes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from longmem.model.backbone import Backbone
from longmem.model.linear import RowLinear, use_row_linears
from tests.tiny import VOCAB, tiny_gpt2, tiny_llama, tiny_qwen2


@pytest.fixture
def mv_calls(monkeypatch) -> list[str]:
    """The names of ``torch.mv`` / ``torch.addmv`` calls made while the test runs."""
    calls: list[str] = []
    for name in ("mv", "addmv"):
        real = getattr(torch, name)

        def spy(*args, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(*args, **kw)

        monkeypatch.setattr(torch, name, spy)
    return calls


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (1, 1, 64), (1, 1, 1, 64)])
def test_one_bfloat16_row_is_a_matrix_vector_product(bias, shape, mv_calls):
    torch.manual_seed(0)
    plain = nn.Linear(64, 200, bias=bias).to(torch.bfloat16)
    row = RowLinear.sharing(plain)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    y = row(x)
    assert mv_calls == ["addmv" if bias else "mv"]
    assert y.shape == (*shape[:-1], 200)
    torch.testing.assert_close(y, F.linear(x, plain.weight, plain.bias))


@pytest.mark.parametrize("dtype,rows", [(torch.bfloat16, 5), (torch.float32, 1), (torch.float32, 5)])
def test_other_products_stay_f_linear(dtype, rows, mv_calls):
    torch.manual_seed(0)
    plain = nn.Linear(32, 16).to(dtype)
    x = torch.randn(rows, 32, dtype=dtype)
    assert torch.equal(RowLinear.sharing(plain)(x), plain(x))
    assert mv_calls == []


def test_gradients_flow_through_the_matrix_vector_path():
    torch.manual_seed(0)
    plain = nn.Linear(16, 8).to(torch.bfloat16)
    row = RowLinear.sharing(plain)
    row(torch.randn(1, 16, dtype=torch.bfloat16)).float().sum().backward()
    assert plain.weight.grad is not None and plain.bias.grad is not None  # the same parameters


def test_use_row_linears_shares_parameters_and_keeps_the_state_dict():
    torch.manual_seed(0)
    emb = nn.Embedding(10, 8)
    head = nn.Linear(8, 10, bias=False)
    head.weight = emb.weight  # tied
    inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    class Sub(nn.Linear):
        pass

    model = nn.ModuleDict({"emb": emb, "inner": inner, "head": head, "sub": Sub(8, 8)}).train(False)
    keys = list(model.state_dict())
    assert use_row_linears(model) == 2
    assert type(model["head"]) is RowLinear and type(model["inner"][0]) is RowLinear
    assert type(model["sub"]) is Sub  # a subclass keeps its own forward
    assert model["head"].weight is model["emb"].weight  # still tied
    assert list(model.state_dict()) == keys
    assert not model["inner"][0].training
    assert use_row_linears(model) == 0  # nothing plain left


def test_a_replaced_linear_keeps_its_hooks():
    plain = nn.Linear(4, 4).to(torch.bfloat16)
    seen = []
    plain.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    holder = nn.Sequential(plain)
    use_row_linears(holder)
    holder(torch.randn(1, 4, dtype=torch.bfloat16))
    assert type(holder[0]) is RowLinear and seen == [(1, 4)]


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2, tiny_gpt2], ids=["llama", "qwen2", "gpt2"])
def test_a_backbone_decodes_the_same_with_row_linears(make, mv_calls):
    bb = make(dtype=torch.bfloat16)
    assert any(isinstance(m, RowLinear) for m in bb.model.modules())  # GPT-2: its LM head (its layers are Conv1D)
    plain = copy.deepcopy(bb.model)
    for m in plain.modules():
        if type(m) is RowLinear:
            m.forward = nn.Linear.forward.__get__(m)
    ids = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        steps = [bb.model(ids[:, : i + 1]).logits[:, -1] for i in (0, 5)]  # the first is one row through every layer
        ref = [plain(ids[:, : i + 1]).logits[:, -1] for i in (0, 5)]
    assert mv_calls  # the one-row pass took the matrix-vector path
    for a, b in zip(steps, ref):
        torch.testing.assert_close(a, b)


def test_a_wrapped_model_is_wrapped_again_without_change():
    bb = tiny_llama()
    n = sum(isinstance(m, RowLinear) for m in bb.model.modules())
    again = Backbone(bb.model, tokenizer=bb.tokenizer)
    assert sum(isinstance(m, RowLinear) for m in again.model.modules()) == n > 0
