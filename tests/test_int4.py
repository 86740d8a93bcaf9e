"""A 4-bit model's one-token projections read as 4 bits (``longmem.model.int4``): a weight whose groups of 32 inputs
each lie on 16 evenly spaced levels is found and reproduced (within bfloat16's rounding of its scales), any other is
left alone, the 4-bit form is read only for a few bfloat16 rows on the CPU, it is kept beside the converted copy and
read back, and a GGUF model quantized in 4 bits (llama and Qwen2, Q4_1 as llama.cpp writes it) decodes with it in
bfloat16 and never in float32."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from longmem.model import int4
from longmem.model.backbone import load_backbone
from longmem.model.int4 import GROUP, MAX_ROWS, ON_GRID, SIDECAR, Int4Weight, PackedInt4
from longmem.model.linear import RowLinear
from tests.tiny_gguf import tiny_gguf


def grid_weight(n: int, k: int, seed: int = 0, top: int = 15) -> torch.Tensor:
    """A (n, k) bfloat16 weight each of whose groups holds levels 0..top of its own step above its own lowest value
    (the lowest and highest present), as a 4-bit quantizer leaves them: its levels are about zero, so bfloat16
    moves each by a few hundredths of a step at most."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, top + 1, (n, k // GROUP, GROUP), generator=g)
    q[..., 0], q[..., 1] = 0, top  # the group spans its whole grid
    step = torch.rand(n, k // GROUP, 1, generator=g) * 0.01 + 0.001
    low = -step * top * torch.rand(n, k // GROUP, 1, generator=g)
    return (low + q * step).view(n, k).to(torch.bfloat16)


def test_a_4bit_weight_is_found_and_reproduced_within_its_rounding():
    w = grid_weight(48, 128)
    form = int4.find_grid(w)
    assert form is not None and form.shape == (48, 128)
    assert int4.check(form, w) <= ON_GRID
    step = form.scales_zeros.float()[..., 0].t().repeat_interleave(GROUP, dim=1)  # (N, K)
    assert ((form.dequantize() - w.float()).abs() <= 0.1 * step).all()


@pytest.mark.parametrize("top", [1, 7, 14])
def test_groups_on_coarser_grids_are_found(top):
    w = grid_weight(16, 64, seed=top, top=top)
    form = int4.find_grid(w)
    assert form is not None and int4.check(form, w) <= ON_GRID


def test_groups_of_one_value_and_zero_rows_are_found_exactly():
    w = grid_weight(16, 64)
    w[3] = 0
    w[5, :GROUP] = 0.25
    form = int4.find_grid(w)
    assert form is not None
    assert torch.equal(form.dequantize()[3], torch.zeros(64))
    assert torch.equal(form.dequantize()[5, :GROUP], torch.full((GROUP,), 0.25))


def test_weights_that_are_not_4bit_are_left_alone():
    torch.manual_seed(0)
    assert int4.find_grid(torch.randn(32, 64).to(torch.bfloat16)) is None  # a float model's
    seventeen = grid_weight(16, 64)
    seventeen[0, :17] = torch.arange(17) * 0.01  # 17 levels in one group
    seventeen[0, 17:GROUP] = 0.0
    assert int4.find_grid(seventeen) is None
    assert int4.find_grid(grid_weight(16, 64)[:, :48]) is None  # inputs not whole groups


def test_one_group_off_its_grid_leaves_the_whole_weight_alone():
    w = grid_weight(64, 64).float()
    w[40, 7] += 0.3 * (w[40, :GROUP].max() - w[40, :GROUP].min()) / 15  # a third of a step off
    assert int4.find_grid(w) is None


def test_levels_pack_two_a_byte_and_unpack():
    q = torch.randint(0, 16, (8, 64), generator=torch.Generator().manual_seed(1))
    packed = int4.pack_levels(q)
    assert packed.shape == (8, 32) and packed.dtype == torch.uint8
    assert torch.equal(packed[0, 0], (q[0, 0] | (q[0, 1] << 4)).to(torch.uint8))
    assert torch.equal(int4.unpack_levels(packed), q.to(torch.int32))


@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
def test_the_kernel_gives_the_product_with_the_weight_the_form_stands_for(rows):
    w = grid_weight(64, 256)
    form = int4.find_grid(w)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got, want = form.for_kernel().matmul(x).float(), x.float() @ form.dequantize().t()
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)


@pytest.fixture
def int4_calls(monkeypatch) -> list[int]:
    """The row counts of the products read through a 4-bit form while the test runs."""
    calls: list[int] = []
    real = PackedInt4.matmul

    def spy(self, x):
        calls.append(x.shape[0])
        return real(self, x)

    monkeypatch.setattr(PackedInt4, "matmul", spy)
    return calls


def _row_linear(bias: bool, dtype: torch.dtype = torch.bfloat16) -> RowLinear:
    plain = nn.Linear(128, 48, bias=bias)
    with torch.no_grad():
        plain.weight.copy_(grid_weight(48, 128).float())
        if bias:
            plain.bias.normal_()
    row = RowLinear.sharing(plain.to(dtype))
    row.give_int4(int4.find_grid(row.weight).for_kernel())
    return row


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 128), (1, 1, 128), (2, 3, 128)])
def test_a_row_linear_reads_few_bfloat16_rows_through_its_4bit_form(bias, shape, int4_calls):
    row = _row_linear(bias)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    y = row(x)
    assert y.shape == (*shape[:-1], 48) and y.dtype == torch.bfloat16
    assert int4_calls == [x.shape[:-1].numel()]
    torch.testing.assert_close(y.float(), F.linear(x, row.weight, row.bias).float(), atol=0.05, rtol=0.02)


def test_many_rows_and_float32_read_the_weights_themselves(int4_calls):
    row = _row_linear(True)
    many = torch.randn(MAX_ROWS + 1, 128).to(torch.bfloat16)
    assert torch.equal(row(many), F.linear(many, row.weight, row.bias))
    f32 = _row_linear(True, torch.float32)
    one = torch.randn(1, 128)
    assert torch.equal(f32(one), F.linear(one, f32.weight, f32.bias))
    assert int4_calls == []


def test_a_copy_or_a_changed_weight_reads_its_own_weights(int4_calls):
    row = _row_linear(False)
    x = torch.randn(1, 128).to(torch.bfloat16)
    copied = copy.deepcopy(row)  # the SideNet's layers are copies of the backbone's
    assert copied.int4 is None and torch.equal(copied(x), F.linear(x, copied.weight))
    trained = _row_linear(False)
    with torch.no_grad():
        trained.weight.copy_(torch.randn(48, 128))  # weights loaded from a checkpoint, or a training step
    assert not trained.has_int4() and torch.equal(trained(x), F.linear(x, trained.weight))
    assert int4_calls == []
    assert row.has_int4()
    row(x)
    assert int4_calls == [1]


def test_a_tied_weight_is_one_projection():
    model = nn.ModuleDict({"a": nn.Linear(64, 64), "b": nn.Linear(64, 64)})
    model["b"].weight = model["a"].weight
    assert list(int4.projections(model)) == ["a.weight"]


# -- kept beside the copy -------------------------------------------------------------------------------------------
def _grid_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 64), nn.Linear(64, 8)).to(torch.bfloat16)
    with torch.no_grad():
        model[0].weight.copy_(grid_weight(32, 64, seed=4))
        model[1].weight.copy_(grid_weight(64, 32, seed=5))  # model[2] stays a float weight
    for i in range(3):
        model[i] = RowLinear.sharing(model[i])
    return model


def test_forms_are_kept_and_read_back_for_the_same_source_only(tmp_path):
    forms = int4.find_forms(_grid_model())
    assert sorted(forms) == ["0.weight", "1.weight"]
    path = tmp_path / SIDECAR
    int4.save_forms(forms, path, {"gguf_sha256": "abc"})
    assert [p.name for p in tmp_path.iterdir()] == [SIDECAR]  # no temporary left
    back = int4.load_forms(path, {"gguf_sha256": "abc"})
    assert sorted(back) == sorted(forms)
    for name, form in forms.items():
        assert torch.equal(back[name].levels, form.levels)
        assert torch.equal(back[name].scales_zeros, form.scales_zeros)
    assert int4.load_forms(path, {"gguf_sha256": "other"}) is None
    bad = dict(forms)
    bad["0.weight"] = Int4Weight(forms["0.weight"].levels, forms["0.weight"].scales_zeros[:1])  # scales cut short
    int4.save_forms(bad, path, {"gguf_sha256": "abc"})
    assert int4.load_forms(path, {"gguf_sha256": "abc"}) is None
    path.write_bytes(b"not safetensors")
    assert int4.load_forms(path, {"gguf_sha256": "abc"}) is None
    assert int4.load_forms(tmp_path / "absent", {}) is None


def test_use_int4_finds_once_then_reads_what_it_kept(tmp_path, monkeypatch):
    model = _grid_model()
    assert int4.use_int4(model, tmp_path, {"k": 1}) == 2
    assert model[0].has_int4() and model[1].has_int4() and not model[2].has_int4()
    assert (tmp_path / SIDECAR).is_file()

    def refuse(_model):
        raise AssertionError("found again")

    monkeypatch.setattr(int4, "find_forms", refuse)
    again = _grid_model()
    assert int4.use_int4(again, tmp_path, {"k": 1}) == 2
    assert torch.equal(again[0].int4.packed, model[0].int4.packed)
    assert torch.equal(again[0].int4.scales_zeros, model[0].int4.scales_zeros)


def test_use_int4_still_decodes_where_the_folder_cannot_be_written(tmp_path, monkeypatch):
    def cannot(*_args):
        raise OSError("read-only file system")

    monkeypatch.setattr(int4, "save_forms", cannot)
    model = _grid_model()
    assert int4.use_int4(model, tmp_path, {}) == 2
    assert not (tmp_path / SIDECAR).exists()


# -- a 4-bit GGUF --------------------------------------------------------------------------------------------------
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _with_int4(bb) -> list[str]:
    return [name for name, m in bb.model.named_modules() if isinstance(m, RowLinear) and m.has_int4()]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_4bit_gguf_decodes_through_its_4bit_forms_in_bfloat16(family, tmp_path, cache, int4_calls):
    path = tmp_path / f"tiny-{family}-q4.gguf"
    tiny_gguf(path, family, quant="Q4_1", hidden=64)
    bb = load_backbone(str(path), "bfloat16")
    per_layer = {f"self_attn.{p}_proj" for p in "qkvo"} | {f"mlp.{p}_proj" for p in ("gate", "up", "down")}
    assert sorted(_with_int4(bb)) == sorted(f"model.layers.{i}.{p}" for i in range(2) for p in per_layer)
    assert len(list(cache.glob(f"backbones/*/{SIDECAR}"))) == 1
    plain = load_backbone(str(path), "bfloat16", int4=False)
    assert _with_int4(plain) == []
    ids = torch.tensor([[5, 40, 77]])

    def prompt_then_step(backbone) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            first = backbone(ids, use_cache=True)  # a prompt: three rows, within MAX_ROWS
            step = backbone(ids[:, -1:], past_key_values=first.past_key_values, use_cache=True)
        return backbone.logits(first.hidden[-1]).float(), backbone.logits(step.hidden[-1]).float()

    got, want = prompt_then_step(bb), prompt_then_step(plain)
    assert int4_calls and set(int4_calls) <= {1, 3}
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0.03, rtol=0.05)


def test_a_4bit_gguf_in_float32_reads_its_weights_only(tmp_path, cache, int4_calls):
    path = tmp_path / "tiny-q4.gguf"
    tiny_gguf(path, "qwen2", quant="Q4_1", hidden=64)
    bb = load_backbone(str(path), "float32")
    assert _with_int4(bb) == [] and not list(cache.glob(f"backbones/*/{SIDECAR}"))
    with torch.no_grad():
        bb(torch.tensor([[5]]))
    assert int4_calls == []


def test_a_float_gguf_has_no_4bit_projection(tmp_path, cache):
    path = tmp_path / "tiny-f32.gguf"
    tiny_gguf(path, "llama", hidden=64)
    assert _with_int4(load_backbone(str(path), "bfloat16")) == []


def test_longmem_int4_0_decodes_with_the_bfloat16_weights(tmp_path, cache, monkeypatch):
    path = tmp_path / "tiny-q4.gguf"
    tiny_gguf(path, "llama", quant="Q4_1", hidden=64)
    monkeypatch.setenv("LONGMEM_INT4", "0")
    assert _with_int4(load_backbone(str(path), "bfloat16")) == []
    assert _with_int4(load_backbone(str(path), "bfloat16", int4=True)) != []


def test_the_sidenets_copied_layers_read_their_own_weights(tmp_path, cache):
    from longmem.model.longmem import LongMemModel
    from tests.tiny import small_config

    path = tmp_path / "tiny-q4.gguf"
    tiny_gguf(path, "llama", quant="Q4_1", hidden=64)
    bb = load_backbone(str(path), "bfloat16")
    model = LongMemModel(bb, small_config(segment_len=32))
    side = [m for m in model.sidenet.modules() if isinstance(m, RowLinear)]
    assert side and not any(m.has_int4() or m.int4 is not None for m in side)
    assert len(_with_int4(bb)) == 14  # the backbone's own still read theirs
