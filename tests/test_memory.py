"""The memory bank: exact faiss search, chunking, FIFO eviction, GQA head mapping, per-row streams."""

import pytest
import torch

from longmem.memory import search as search_module
from longmem.memory.memory import Memory
from longmem.memory.ranking import TOPK_BLOCK, topk_blocked
from longmem.memory.search import RESCORED, StoredKeys, upcast_product


def _bank(**kw):
    base = dict(chunk_size=4, capacity=None, batch_size=1, dtype=torch.float32)
    base.update(kw)
    return Memory(2, 8, **base)


def _kv(T, B=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 2, T, 8, generator=g), torch.randn(B, 2, T, 8, generator=g)


def test_search_equals_brute_force_topk():
    bank = _bank()
    k, v = _kv(64)
    bank.add(k, v)
    q = torch.randn(1, 6, 5, 8)  # 6 query heads over 2 KV heads: groups of 3
    r = bank.search(q, n_chunks=3)
    chunk_keys = k[0].view(2, 16, 4, 8).mean(dim=2)  # (Hkv, chunks, d)
    for h in range(6):
        scores = q[0, h] @ chunk_keys[h // 3].T  # (T, chunks)
        want = scores.topk(3, dim=-1).indices
        assert torch.equal(r.chunk_ids[0, h].sort(-1).values, want.sort(-1).values)
        # the returned token keys/values are exactly the chunks' tokens, flattened
        for t in range(5):
            for j, c in enumerate(r.chunk_ids[0, h, t]):
                torch.testing.assert_close(r.keys[0, h, t, j * 4:(j + 1) * 4], k[0, h // 3, c * 4:(c + 1) * 4])
                torch.testing.assert_close(r.values[0, h, t, j * 4:(j + 1) * 4], v[0, h // 3, c * 4:(c + 1) * 4])
    assert r.keys.shape == (1, 6, 5, 12, 8) and r.mask.all()


def _assert_gathered(bank, r, k, v, b=0, group=1):
    """Every valid retrieved token is the stored token of the chunk search named (k, v: (Hkv, T, d) as added)."""
    n = bank.chunk_size
    for h in range(r.keys.shape[1]):
        for t in range(r.keys.shape[2]):
            for j, c in enumerate(r.chunk_ids[b, h, t].tolist()):
                if c < 0:
                    assert not r.mask[b, h, t, j * n:(j + 1) * n].any()
                    continue
                torch.testing.assert_close(r.keys[b, h, t, j * n:(j + 1) * n], k[h // group, c * n:(c + 1) * n])
                torch.testing.assert_close(r.values[b, h, t, j * n:(j + 1) * n],
                                           v[h // group, c * n:(c + 1) * n])


def test_batched_rows_and_strided_chunks_gather_their_own_tokens():
    bank = _bank(batch_size=2)
    k, v = _kv(40, B=2)
    bank.add(k, v)
    bank.add(*_kv(20, B=2, seed=1))  # grows the chunk tables: capacity > chunks stored
    k2, v2 = _kv(20, B=2, seed=1)
    kk, vv = torch.cat([k, k2], dim=2), torch.cat([v, v2], dim=2)
    r = bank.search(torch.randn(2, 4, 3, 8), n_chunks=5)
    for b in range(2):
        _assert_gathered(bank, r, kk[b], vv[b], b=b, group=2)
    fine = _bank()
    fine.add(kk[:1], vv[:1])
    fine = fine.rechunk(2)  # adopts a strided view of the coarse chunk tables
    assert not fine.rows[0].k.is_contiguous()
    _assert_gathered(fine, fine.search(torch.randn(1, 2, 4, 8), n_chunks=6), kk[0], vv[0])


def test_fewer_chunks_than_asked_are_masked():
    bank = _bank()
    bank.add(*_kv(8))  # 2 chunks
    r = bank.search(torch.randn(1, 2, 3, 8), n_chunks=4)
    assert r.mask[..., :8].all() and not r.mask[..., 8:].any()
    assert (r.chunk_ids[..., 2:] == -1).all()


def test_empty_bank_returns_nothing_valid():
    r = _bank().search(torch.randn(1, 2, 3, 8), n_chunks=2)
    assert not r.mask.any() and r.keys.shape == (1, 2, 3, 8, 8)


def test_partial_chunks_wait_until_full():
    bank = _bank()
    k, v = _kv(6)
    bank.add(k[:, :, :3], v[:, :, :3])
    assert len(bank) == 0
    bank.add(k[:, :, 3:], v[:, :, 3:])
    assert len(bank) == 4  # one full chunk; 2 tokens pending
    r = bank.search(torch.randn(1, 2, 1, 8), n_chunks=1)
    torch.testing.assert_close(r.keys[0, 0, 0], k[0, 0, :4])


def test_fifo_eviction_drops_oldest_first():
    bank = _bank(capacity=16)  # 4 chunks
    tokens = torch.arange(28).view(1, 28)
    k, v = _kv(28)
    bank.add(k, v, tokens=tokens)  # 7 chunks -> keep the newest 4
    assert len(bank) == 16
    row = bank.rows[0]
    assert row.evicted == 3
    assert torch.equal(row.tokens[:4].flatten(), torch.arange(12, 28))
    torch.testing.assert_close(row.k[:, :4].reshape(2, 16, 8), k[0, :, 12:28])
    with pytest.raises(KeyError):
        bank.chunk_tokens(0, 2)
    assert torch.equal(bank.chunk_tokens(0, 3), torch.arange(12, 16))
    # the index only knows the kept chunks: every hit is one of serials 3..6
    r = bank.search(torch.randn(1, 2, 10, 8), n_chunks=4)
    assert set(r.chunk_ids.unique().tolist()) == {3, 4, 5, 6}


def test_eviction_keeps_index_and_tensors_aligned():
    bank = _bank(capacity=8, chunk_size=2)
    k, v = _kv(20)
    bank.add(k, v)
    q = k[:, :1, -2:].mean(dim=2, keepdim=True).repeat(1, 2, 1, 1) * 100  # points at the newest chunk
    r = bank.search(q, n_chunks=1)
    torch.testing.assert_close(r.keys[0, 0, 0], k[0, 0, -2:])


def test_rows_are_independent_streams_and_clear_by_row():
    bank = _bank(batch_size=2)
    k, v = _kv(8, B=2)
    bank.add(k, v, tokens=torch.stack([torch.arange(8), torch.arange(100, 108)]))
    assert bank.sizes() == [8, 8]
    r = bank.search(torch.randn(2, 2, 3, 8), n_chunks=2)
    assert torch.equal(r.keys[1, 0].reshape(-1, 4, 8)[0], k[1, 0, :4]) or \
        torch.equal(r.keys[1, 0].reshape(-1, 4, 8)[0], k[1, 0, 4:])
    bank.clear(rows=[0])
    assert bank.sizes() == [0, 8]
    bank.clear()
    assert bank.sizes() == [0, 0]


def test_shape_errors_name_the_problem():
    bank = _bank()
    with pytest.raises(ValueError, match="memory expects"):
        bank.add(torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8))
    with pytest.raises(ValueError, match="do not fit"):
        bank.search(torch.zeros(1, 3, 1, 8), 1)
    with pytest.raises(ValueError, match="capacity"):
        Memory(2, 8, chunk_size=4, capacity=2)


def test_bf16_storage_keeps_fp32_index():
    bank = _bank(dtype=torch.bfloat16)
    k, v = _kv(16)
    bank.add(k, v)
    r = bank.search(torch.randn(1, 2, 2, 8), n_chunks=2)
    assert r.keys.dtype == torch.bfloat16 and r.mask.all()


# -- attention sinks: chunks holding a token that began a forward pass ----------------------------------------------


def _sink_bank(max_sinks, segments=6, seg_len=16, seed=0):
    """A bank of ``segments`` segments whose first tokens have huge keys (like attention sinks): every query's top
    chunks would be the segments' first chunks."""
    bank = _bank(max_sinks=max_sinks)
    k, v = _kv(segments * seg_len, seed=seed)
    k[:, :, ::seg_len] = 40.0
    starts = torch.zeros(1, segments * seg_len, dtype=torch.bool)
    starts[:, ::seg_len] = True
    bank.add(k, v, starts=starts)
    return bank, k


def test_sink_chunks_are_flagged_by_starts():
    bank, _ = _sink_bank(max_sinks=1)
    flagged = bank.rows[0].starts.any(dim=1)[: bank.rows[0].n]
    assert flagged.nonzero().flatten().tolist() == [0, 4, 8, 12, 16, 20]  # chunk 0 of every 4-chunk segment


def test_at_most_max_sinks_sink_chunks_per_query():
    q = torch.rand(1, 6, 5, 8) + 0.1  # positive queries: the sink keys (all 40) score highest
    plain, k = _sink_bank(max_sinks=None)
    assert (plain.search(q, n_chunks=4).chunk_ids % 4 == 0).all()  # unlimited: the 4 best are all sink chunks
    bank, _ = _sink_bank(max_sinks=1)
    ids = bank.search(q, n_chunks=4).chunk_ids  # (1, 6, 5, 4)
    chunk_keys = k[0].view(2, 24, 4, 8).mean(dim=2)
    sinks = torch.tensor([c % 4 == 0 for c in range(24)])
    for h in range(6):
        scores = q[0, h] @ chunk_keys[h // 3].T  # (T, 24)
        best_sink = scores.masked_fill(~sinks, -1e9).argmax(-1, keepdim=True)
        rest = scores.masked_fill(sinks, -1e9).topk(3, dim=-1).indices
        want = torch.cat([best_sink, rest], dim=-1)  # the best sink chunk, then the 3 best others, by score
        assert torch.equal(ids[0, h], want)
    none = _sink_bank(max_sinks=0)[0].search(q, n_chunks=4).chunk_ids
    assert not (none % 4 == 0).any() and (none >= 0).all()


def test_sink_limit_with_few_chunks_masks_the_rest():
    bank, _ = _sink_bank(max_sinks=0, segments=2, seg_len=4)  # 2 chunks, both sinks
    r = bank.search(torch.rand(1, 2, 3, 8), n_chunks=2)
    assert (r.chunk_ids == -1).all() and not r.mask.any()


def test_sink_flags_follow_eviction_and_rechunk():
    bank = _bank(capacity=32, max_sinks=1)
    k, v = _kv(48)
    starts = torch.zeros(1, 48, dtype=torch.bool)
    starts[:, ::16] = True
    bank.add(k, v, starts=starts)  # 12 chunks, capacity 8: chunks 4..11 stay, sinks at chunks 4 and 8
    row = bank.rows[0]
    assert row.starts[: row.n].any(dim=1).nonzero().flatten().tolist() == [0, 4]
    fine = bank.rechunk(2)
    frow = fine.rows[0]
    assert frow.starts[: frow.n].any(dim=1).nonzero().flatten().tolist() == [0, 8] and fine.max_sinks == 1


def test_bad_max_sinks():
    with pytest.raises(ValueError, match="max_sinks"):
        _bank(max_sinks=-1)


def test_select_marks_exactly_the_searched_chunks():
    bank = _bank(max_sinks=1)
    k, v = _kv(64)
    starts = torch.zeros(1, 64, dtype=torch.bool)
    starts[0, [0, 32]] = True  # two sink chunks: the limit applies to both paths alike
    bank.add(k, v, starts=starts)
    q = torch.randn(1, 6, 5, 8)
    r, s = bank.search(q, n_chunks=3), bank.select(q, n_chunks=3)
    assert torch.equal(r.chunk_ids, s.chunk_ids)
    assert s.keys.shape == (1, 2, 64, 8) and s.mask.shape == (1, 6, 5, 64)
    torch.testing.assert_close(s.keys[0], k[0])
    torch.testing.assert_close(s.values[0], v[0])
    for h in range(6):
        for t in range(5):
            want = torch.zeros(64, dtype=torch.bool)
            for c in r.chunk_ids[0, h, t]:
                want[c * 4:(c + 1) * 4] = True
            assert torch.equal(s.mask[0, h, t], want)


def test_select_pads_shorter_rows_and_an_empty_bank_selects_nothing():
    bank = _bank(batch_size=2)
    k, v = _kv(16, B=2)
    bank.add(k, v)
    bank.clear([1])  # row 1 starts a new document and has read only 8 tokens of it so far
    k1, v1 = _kv(8, B=2, seed=1)
    bank.rows[1].add(k1[1], v1[1], torch.full((8,), -1), torch.zeros(8, dtype=torch.bool))
    assert bank.sizes() == [16, 8]
    s = bank.select(torch.randn(2, 2, 3, 8), n_chunks=4)
    assert s.keys.shape == (2, 2, 16, 8) and s.mask.shape == (2, 2, 3, 16)
    assert s.mask[0].sum(-1).eq(16).all()  # 4 chunks of 4 tokens: the whole of row 0
    assert s.mask[1, ..., :8].all() and not s.mask[1, ..., 8:].any()  # row 1: its 2 chunks, never the padding
    assert (s.chunk_ids[1, ..., 2:] == -1).all()
    empty = _bank().select(torch.randn(1, 2, 3, 8), n_chunks=2)
    assert empty.keys.shape == (1, 2, 0, 8) and not empty.mask.any()


def test_truncate_forgets_what_came_after_and_searches_as_before():
    g = torch.Generator().manual_seed(3)
    first, later = (torch.randn(1, 2, n, 8, generator=g) for n in (24, 14))
    bank, fresh = _bank(), _bank()
    for b in (bank, fresh):
        b.add(first, first)
    bank.add(later, later)  # 3 more whole chunks and 2 pending tokens
    assert len(bank) == 36
    bank.truncate(24)
    q = torch.randn(1, 4, 5, 8, generator=g)
    a, b = bank.search(q, 3), fresh.search(q, 3)
    assert len(bank) == 24 and torch.equal(a.chunk_ids, b.chunk_ids) and torch.equal(a.keys, b.keys)
    assert bank.rows[0].pend_t.numel() == 0 and all(ix.ntotal == 6 for ix in bank.rows[0].indexes)
    bank.truncate(40)  # holds no more: nothing changes
    assert len(bank) == 24
    with pytest.raises(ValueError, match="whole number"):
        bank.truncate(5)


class _Twin:
    """An approximate memory and an exact one fed the same operations, to compare their searches."""

    def __init__(self, **kw):
        self.approx, self.exact = _bank(**kw), _bank(**kw)

    def __getattr__(self, name):
        def both(*a, **kw):
            getattr(self.exact, name)(*a, **kw)
            return getattr(self.approx, name)(*a, **kw)
        return both

    def same(self, q, n) -> bool:
        return torch.equal(self.approx.search(q, n).chunk_ids, self.exact.search(q, n).chunk_ids)


def test_approximate_search_probing_every_list_finds_the_exact_chunks_through_adds_truncations_and_evictions():
    twin = _Twin(capacity=4 * 600)
    twin.approx.approximate(min_chunks=100, probes=10_000)  # every list: exact results
    row = twin.approx.rows[0]
    q = torch.randn(1, 6, 7, 8, generator=torch.Generator().manual_seed(1))
    twin.add(*_kv(4 * 80))
    assert twin.same(q, 5) and row.coarse is None  # below min_chunks the exact index is read
    twin.add(*_kv(4 * 300, seed=1))  # 380 chunks: the IVF copies are built at the next search
    assert twin.same(q, 5) and row.coarse is not None and row.coarse_n == 380
    built = row.coarse
    twin.truncate(4 * 200)  # a text added for one question only, then another one
    twin.add(*_kv(4 * 50, seed=2))
    assert twin.same(q, 5) and row.coarse is built and row.coarse_n == 250  # followed, not built again
    twin.add(*_kv(4 * 400, seed=3))  # past the capacity of 600 chunks: the oldest are evicted and positions move
    assert row.evicted > 0 and row.coarse is None
    assert twin.same(q, 5) and row.coarse_n == 600


def test_approximate_search_with_few_probes_still_finds_most_of_the_best_chunks_and_rechunk_keeps_it():
    twin = _Twin()
    twin.approx.approximate(min_chunks=64)  # the default share of lists
    centres = torch.randn(16, 8, generator=torch.Generator().manual_seed(4)) * 3
    pick = torch.randint(0, 16, (4 * 2000,), generator=torch.Generator().manual_seed(5))
    k = (centres[pick] + torch.randn(4 * 2000, 8, generator=torch.Generator().manual_seed(6)))
    k = k.view(1, 1, -1, 8).expand(1, 2, -1, 8).contiguous()
    twin.add(k, k.clone())
    q = centres[torch.arange(6)].view(1, 6, 1, 8) + 0.1
    got, want = twin.approx.search(q, 8).chunk_ids, twin.exact.search(q, 8).chunk_ids
    overlap = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(got.view(-1, 8), want.view(-1, 8)))
    assert overlap >= 0.8 * want.numel() and (got >= 0).all()
    assert twin.approx.rechunk(2).rows[0].approx == twin.approx.rows[0].approx
    with pytest.raises(ValueError, match="approximate search needs"):
        twin.approx.approximate(0)


# -- search on a device (a GPU in use; the same code on the CPU here) -------------------------------------------------


@pytest.mark.parametrize("released", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_search_finds_what_faiss_finds_through_adds_truncations_evictions_and_sinks(dtype, released):
    """The search by matrix product (a GPU's; a bfloat16 memory's on a CPU with native bfloat16, re-ranked by exact
    scores; a float32 memory's exact, the GPU's code), forced here on any CPU, against faiss on the same operations;
    ``released``: with its faiss indexes freed after the first search (a mapped bank's memory), scored again from
    the chunks' own keys."""
    kw = dict(capacity=4 * 300, max_sinks=1, dtype=dtype)
    faiss_bank, matmul = _bank(matmul=False, **kw), _bank(matmul=True, **kw)
    if released:
        matmul.release_indexes()
    q = torch.randn(1, 6, 7, 8, generator=torch.Generator().manual_seed(1))

    def same():
        a, b = faiss_bank.search(q, 5), matmul.search(q, 5)
        assert torch.equal(a.chunk_ids, b.chunk_ids) and torch.equal(a.keys, b.keys) and torch.equal(a.mask, b.mask)
        assert torch.equal(faiss_bank.select(q, 5).mask, matmul.select(q, 5).mask)

    def add(T, seed):
        k, v = _kv(T, seed=seed)
        k[:, :, ::32] = 5.0  # a segment start every 32 tokens: sink chunks, at most one per query
        starts = torch.zeros(1, T, dtype=torch.bool)
        starts[:, ::32] = True
        for bank in (faiss_bank, matmul):
            bank.add(k.to(dtype), v.to(dtype), starts=starts)

    add(4 * 50, 0)
    same()
    row = matmul.rows[0]
    assert (row.indexes is None) is released  # freed once the search copy was built
    assert row.mirror_keys().shape == (2, 50, 8) and row.mirror.dtype == dtype  # bfloat16 on a CPU: half the bytes read
    add(4 * 20 + 2, 1)  # the mirror follows the adds at the next search; a partial chunk waits
    same()
    for bank in (faiss_bank, matmul):
        bank.truncate(4 * 40)
    assert row.mirror_n == 40 and row.mirror.shape[1] > 40  # its room is kept
    same()
    add(4 * 400, 2)  # past the capacity: the oldest are evicted, positions move, the mirror is built again
    assert row.evicted > 0
    same()
    assert row.mirror_n == row.n == 300
    assert matmul.rechunk(2).matmul and not faiss_bank.rechunk(2).matmul


def test_the_bfloat16_matmul_search_ranks_near_ties_by_their_exact_scores():
    """Chunks whose keys (means of four bfloat16 token keys, exact in float32) bfloat16 rounds to one value come back
    in the order of their exact scores, as from faiss: the rounded scores only choose the candidates."""
    u = 2.0 ** -7  # bfloat16's spacing in [1, 2)
    c = torch.arange(200)
    tokens = 1 + (c // 4 * u).repeat_interleave(4)  # chunk c: four tokens at 1 + (c // 4) u ...
    tokens[3::4] += (c % 4) * u  # ... the last one (c % 4) u higher: chunk means 1 + (c // 4 + (c % 4) / 4) u
    tokens = torch.cat([tokens, torch.full((800,), -3.0)])  # and 200 chunks far below: the mirror's keys, less
    #                                                           their mean, stay large enough to tie when rounded
    k = tokens.view(1, 1, 1600, 1).expand(1, 2, 1600, 8).contiguous().bfloat16()  # every token key exact in bf16
    q = torch.ones(1, 2, 1, 8)
    faiss_bank, matmul = (_bank(matmul=m, dtype=torch.bfloat16) for m in (False, True))
    for bank in (faiss_bank, matmul):
        bank.add(k, k)
    assert matmul.rows[0].mirror_keys()[0, :200, 0].unique().numel() < 100  # ties once rounded
    want = torch.arange(199, 193, -1)  # the largest first
    assert torch.equal(faiss_bank.search(q, 6).chunk_ids[0, 0, 0], want)
    assert torch.equal(matmul.search(q, 6).chunk_ids[0, 0, 0], want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is missing")
def test_search_on_a_gpu_without_cuda_is_refused_by_name():
    with pytest.raises(RuntimeError, match="cuda.*no CUDA device"):
        _bank(search_device="cuda")


@pytest.mark.parametrize("n", [4 * 97, 4 * 97 + 3])  # whole blocks, and a shorter last one
def test_the_two_step_topk_finds_what_topk_finds(n):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 5, n, generator=g)
    scores[0, 0, ::7] = float("-inf")  # masked columns (sink chunks) are never among the best while others remain
    values, cols = topk_blocked(scores, 9, block=4)
    want_values, want_cols = torch.topk(scores, 9, dim=-1)
    assert torch.equal(values, want_values) and torch.equal(cols, want_cols)
    assert torch.equal(topk_blocked(scores, 9, block=n)[1], want_cols)  # one block: topk itself


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_memory_s_matmul_search_finds_what_faiss_finds(dtype):
    """Enough chunks that the search ranks blocks of columns first (``topk_blocked``), sink chunks among them."""
    n_chunks = 4 * (5 + RESCORED) * TOPK_BLOCK + 1000
    kw = dict(max_sinks=1, dtype=dtype)
    faiss_bank, matmul = _bank(matmul=False, **kw), _bank(matmul=True, **kw)
    k, v = _kv(4 * n_chunks, seed=3)
    starts = torch.zeros(1, 4 * n_chunks, dtype=torch.bool)
    starts[:, ::1024] = True
    k[:, :, ::1024] = 4.0
    for bank in (faiss_bank, matmul):
        bank.add(k.to(dtype), v.to(dtype), starts=starts)
    q = torch.randn(1, 6, 7, 8, generator=torch.Generator().manual_seed(2))
    a, b = faiss_bank.search(q, 5), matmul.search(q, 5)
    assert torch.equal(a.chunk_ids, b.chunk_ids) and torch.equal(a.keys, b.keys)
    sinks = set(range(0, n_chunks, 256))
    assert all(sum(int(c) in sinks for c in row) <= 1 for row in b.chunk_ids.reshape(-1, 5))


def test_a_memory_that_released_its_indexes_searches_by_product_or_approximately_never_by_exact_faiss():
    memory = _bank(matmul=True).release_indexes()
    k, v = _kv(4 * 64)
    memory.add(k, v)
    q = torch.randn(1, 6, 3, 8, generator=torch.Generator().manual_seed(3))
    exact = memory.search(q, 2).chunk_ids
    assert memory.rows[0].indexes is None and memory.rows[0].coarse is None
    memory.approximate(min_chunks=32, probes=10 ** 6)  # every IVF list compared: the exact best chunks again
    assert torch.equal(memory.search(q, 2).chunk_ids, exact) and memory.rows[0].coarse is not None
    memory.add(*_kv(4 * 8, seed=5))  # the IVF copies follow adds with no exact index to add to
    memory.search(q, 2)
    assert memory.rows[0].coarse_n == 72
    with pytest.raises(ValueError, match="matrix product"):
        _bank(matmul=False).release_indexes()
    with pytest.raises(RuntimeError, match="released"):
        memory.rows[0].index_keys()


def _stored_twin(dtype, mirror_dtype, covered, native=True):
    """A faiss memory of 50 chunks, and the same chunks adopted by a memory that holds no faiss index, its search copy
    made from stored float32 keys of the first ``covered`` chunks (as a bank's index files hold them)."""
    faiss_bank = _bank(matmul=False, dtype=dtype, max_sinks=1, capacity=4 * 300)
    k, v = _kv(4 * 50, seed=4)
    starts = torch.zeros(1, 4 * 50, dtype=torch.bool)
    starts[:, ::32] = True
    faiss_bank.add(k.to(dtype), v.to(dtype), starts=starts)
    row = faiss_bank.rows[0]
    keys = [x[:covered].clone() for x in row.index_keys()]
    stored = StoredKeys(keys, owner="the mapping")
    room = 64
    kk, vv = (torch.zeros(2, room, 4, 8, dtype=dtype) for _ in range(2))
    kk[:, :50], vv[:, :50] = row.k[:, :50], row.v[:, :50]
    tokens = torch.full((room, 4), -1, dtype=torch.int64)
    st = torch.zeros(room, 4, dtype=torch.bool)
    st[:50] = row.starts[:50]
    twin = Memory.from_chunks(kk, vv, tokens, n=50, capacity=4 * 300, starts=st, max_sinks=1,
                              mirror_dtype=mirror_dtype, stored_keys=stored, native_bf16=native)
    return faiss_bank, twin


@pytest.mark.parametrize("covered", [50, 30, 0])  # the stored keys hold all chunks, the first ones, none
@pytest.mark.parametrize("dtype,mirror_dtype,native", [
    (torch.float32, torch.float32, True), (torch.bfloat16, torch.float32, True),
    (torch.bfloat16, torch.bfloat16, True), (torch.bfloat16, torch.bfloat16, False)])  # native: bfloat16 products
def test_a_memory_made_from_stored_keys_searches_as_faiss_does(dtype, mirror_dtype, native, covered, monkeypatch):
    """A large bank's memory (``StoredKeys``: no faiss index, a float32 or bfloat16 search copy, the latter multiplied
    in bfloat16 or, where that is not native, in float32 blocks) finds what faiss finds through adds, a truncation
    below what the stored keys cover, and evictions; it lets the stored keys go once its copy is made."""
    monkeypatch.setattr(search_module, "UPCAST_BLOCK", 7)  # several blocks of 50-chunk memories
    faiss_bank, twin = _stored_twin(dtype, mirror_dtype, covered, native)
    row = twin.rows[0]
    assert row.indexes is None and row.matmul and row.stored is not None
    q = torch.randn(1, 6, 7, 8, generator=torch.Generator().manual_seed(5))

    def same():
        a, b = faiss_bank.search(q, 5), twin.search(q, 5)
        assert torch.equal(a.chunk_ids, b.chunk_ids) and torch.equal(a.keys, b.keys) and torch.equal(a.mask, b.mask)

    same()
    assert row.stored is None and row.mirror.dtype == mirror_dtype  # the copy serves from now on
    faiss_bank2, twin2 = _stored_twin(dtype, mirror_dtype, covered, native)  # truncated before its first search
    for bank in (faiss_bank2, twin2):
        bank.truncate(4 * 20)
        bank.add(*(x.to(dtype) for x in _kv(4 * 30, seed=6)))  # new chunks where the stored keys' used to be
    a, b = faiss_bank2.search(q, 5), twin2.search(q, 5)
    assert torch.equal(a.chunk_ids, b.chunk_ids)
    faiss_bank3, twin3 = _stored_twin(dtype, mirror_dtype, covered, native)  # evicted before its first search
    for bank in (faiss_bank3, twin3):
        bank.add(*(x.to(dtype) for x in _kv(4 * 260, seed=8)))  # 310 chunks where 300 fit: the oldest go
    assert twin3.rows[0].evicted > 0 and twin3.rows[0].stored is not None
    a, b = faiss_bank3.search(q, 5), twin3.search(q, 5)
    assert torch.equal(a.chunk_ids, b.chunk_ids) and torch.equal(a.keys, b.keys)
    for bank in (faiss_bank, twin):
        bank.add(*(x.to(dtype) for x in _kv(4 * 400, seed=7)))  # past the capacity: evicted
    assert row.evicted > 0
    same()


def test_a_bfloat16_copy_multiplied_in_float32_blocks_scores_as_its_float32_product(monkeypatch):
    """``upcast_product``: blocks of any size, the last one short, give the float32 product of the bfloat16 keys."""
    monkeypatch.setattr(search_module, "UPCAST_BLOCK", 16)
    g = torch.Generator().manual_seed(9)
    keys, rows = torch.randn(50, 8, generator=g).bfloat16(), torch.randn(3, 8, generator=g)
    out = torch.full((3, 50), float("nan"))
    upcast_product(rows, keys, out)
    torch.testing.assert_close(out, rows @ keys.float().T, rtol=1e-6, atol=1e-6)


def test_stored_keys_are_refused_where_they_do_not_fit():
    k = torch.zeros(2, 10, 4, 8)
    tokens = torch.zeros(10, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="float32"):
        StoredKeys([torch.zeros(3, 8, dtype=torch.float16)] * 2)
    keys = StoredKeys([torch.zeros(10, 8)] * 2)
    with pytest.raises(ValueError, match="no faiss index"):
        Memory.from_chunks(k, k, tokens, matmul=False, stored_keys=keys)
    with pytest.raises(ValueError, match="at most 10 chunks"):
        Memory.from_chunks(k, k, tokens, stored_keys=StoredKeys([torch.zeros(11, 8)] * 2))
    with pytest.raises(ValueError, match="search copy"):
        _bank(mirror_dtype=torch.float16)
