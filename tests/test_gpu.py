"""The GPU path against the CPU path (``make gpu-check`` runs these on a CUDA machine; skipped elsewhere): the
backbone's forward, LongMem's step with its memory, the memory search on the device, a bank ingested on the GPU
that reopens on the CPU and answers the same, and training steps on the GPU.

Tolerances: float32 on the GPU differs from the CPU by summation order only (1e-4 here); bfloat16 by its rounding of
each op's result, which compounds over layers and can move a near-tie among retrieved chunks, so there the check is
on the whole tensor: its mean error within 2% of its mean size."""

import pytest
import torch
from tiny import chat_model, tiny_backbone

from longmem.memory.memory import Memory
from longmem.model.lm import Sampling
from longmem.model.longmem import LongMemModel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here; `make gpu-check` runs these on a machine with a GPU")]

DTYPES = [torch.float32, torch.bfloat16]


def assert_near(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """``got`` (from the GPU) is ``want`` (from the CPU) within what ``dtype`` allows (module doc)."""
    got, want = got.detach().cpu().float(), want.detach().cpu().float()
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    else:
        assert got.shape == want.shape
        assert (got - want).abs().mean() <= 0.02 * want.abs().mean(), (got - want).abs().max()


def _twins(family: str, dtype: torch.dtype, **config) -> tuple[LongMemModel, LongMemModel]:
    """The same tiny LongMem model (same seed, same weights) on the CPU and on the GPU."""
    from tiny import small_config

    cpu = LongMemModel(tiny_backbone(family, dtype), small_config(**config)).eval()
    gpu = LongMemModel(tiny_backbone(family, dtype), small_config(**config)).to("cuda").eval()
    return cpu, gpu


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 97, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_backbone_forward_on_the_gpu_equals_the_cpu(family, dtype):
    cpu, gpu = tiny_backbone(family, dtype), tiny_backbone(family, dtype).to("cuda")
    ids = _ids(40)
    a = cpu(ids, keep={2}).hidden[2]
    b = gpu(ids.cuda(), keep={2}).hidden[2]
    assert_near(b, a, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_longmem_step_with_memory_on_the_gpu_equals_the_cpu(family, dtype):
    cpu, gpu = _twins(family, dtype)
    ids = _ids(96)
    mem_cpu, mem_gpu = cpu.new_memory(capacity=None), gpu.new_memory(capacity=None)
    assert mem_cpu.search_device is None and mem_gpu.search_device.type == "cuda"
    cpu.memorize(ids[:, :80], mem_cpu)
    gpu.memorize(ids[:, :80].cuda(), mem_gpu)
    assert_near(mem_gpu.rows[0].k[:, : mem_gpu.rows[0].n], mem_cpu.rows[0].k[:, : mem_cpu.rows[0].n], dtype)
    a, b = cpu(ids[:, 80:], mem_cpu), gpu(ids[:, 80:].cuda(), mem_gpu)
    assert_near(b.logits, a.logits, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_memory_search_on_the_gpu_finds_what_faiss_finds(dtype):
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 3, 4096, 16, generator=g).to(dtype), torch.randn(1, 3, 4096, 16, generator=g).to(dtype)
    on_cpu = Memory(3, 16, chunk_size=4, capacity=None, dtype=dtype, matmul=False)  # faiss
    on_gpu = Memory(3, 16, chunk_size=4, capacity=None, dtype=dtype, search_device="cuda")
    assert on_gpu.matmul
    for memory in (on_cpu, on_gpu):
        memory.add(k, v)
    q = torch.randn(1, 9, 7, 16, generator=g)
    a, b = on_cpu.search(q, 8), on_gpu.search(q.cuda(), 8)
    assert torch.equal(a.chunk_ids, b.chunk_ids.cpu()) and torch.equal(a.keys, b.keys.cpu())
    assert b.keys.device.type == "cuda"


def test_a_bank_ingested_on_the_gpu_reopens_on_the_cpu_and_answers_the_same(tmp_path):
    from helpers import story

    from longmem.ingest.pipeline import ingest
    from longmem.storage import BankDirectory

    book = tmp_path / "story.txt"
    book.write_text(story())
    cpu, gpu = chat_model(segment_len=512), chat_model(segment_len=512).to("cuda")
    directory = BankDirectory(tmp_path / "banks")
    for name, model in (("on-gpu", gpu), ("on-cpu", cpu)):  # float32 K/V: a rounding flip cannot change a token
        with directory.create(name, model, kv_dtype="float32") as bank:
            ingest(bank, model, book)
    sampling = Sampling(max_new_tokens=24, temperature=0.0)
    prompt = _ids(30, seed=3)
    with directory.open("on-gpu") as made_on_gpu, directory.open("on-cpu") as made_on_cpu:
        a, b = made_on_gpu.load_memory(cpu), made_on_cpu.load_memory(cpu)
        assert len(a) == len(b) > 0
        assert_near(a.rows[0].k[:, : a.rows[0].n], b.rows[0].k[:, : b.rows[0].n], torch.float32)
        read_on_cpu = list(cpu.generate(prompt, a, sampling))
        assert read_on_cpu == list(cpu.generate(prompt, b, sampling))
        assert read_on_cpu == list(gpu.generate(prompt.cuda(), made_on_gpu.load_memory(gpu), sampling))


def test_training_steps_run_on_the_gpu():
    from longmem.bench.gpu import bench_train

    result = bench_train("cuda", batch=2, memory_tokens=512, steps=3, segment_len=128)
    assert result["tok_s"] > 0 and torch.isfinite(torch.tensor(result["loss"]))
