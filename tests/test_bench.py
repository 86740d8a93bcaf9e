"""The benchmarks' bookkeeping (targets, the dtype comparison) on fixed numbers, and a real quick run on purpose
(-m slow)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longmem.bench.inference import target


def test_target_directions():
    assert target(1400.0, 1300.0, True)["met"] and not target(1200.0, 1300.0, True)["met"]
    assert target(0.2, 0.25, False)["met"] and not target(0.3, 0.25, False)["met"]
    assert target(0.3, 0.25, False, doc_tokens=8192)["doc_tokens"] == 8192


def _runs(scale: float) -> dict:
    """The parts of the ``bench.inference`` and ``bench.bank`` JSON that the dtype comparison reads, every speed
    times ``scale``."""
    bank = {"memorize": {"tok_s": 1000 * scale},
            "forward": {"longmem_tok_s": 800 * scale, "backbone_tok_s": 900 * scale},
            "retrieval": {"ms_per_1k": 50 / scale},
            "generation": {"longmem": {"tok_s": 10 * scale}, "backbone": {"tok_s": 20 * scale}}}
    scoring = {"2048": {"longmem_tok_s": 300 * scale, "backbone_tok_s": 350 * scale, "longmem_peak_rss_mb": 900.0,
                        "longmem_ppl": 20.0 + scale / 100, "backbone_ppl": 21.0}}
    return {"bench.inference": {"scenarios": {"bank": bank}, "scoring": scoring},
            "bench.bank": {"ingest": {"memorize_tok_s": 1000 * scale, "ingest_tok_s": 950 * scale},
                           "reopen_warm": {"s": 0.5}}}


def test_dtype_comparison_puts_each_measurement_side_by_side():
    from longmem.bench.dtypes import markdown, side_by_side
    from longmem.bench.inference import machine_facts

    rows = {r["measurement"]: r for r in side_by_side({"bfloat16": _runs(2.7), "float32": _runs(1.0)})}
    mem = rows["memorize (ingestion), tok/s"]
    assert (mem["bfloat16"], mem["float32"]) == (2700, 1000) and mem["bf16_over_fp32"] == pytest.approx(2.7)
    assert rows["retrieval (memory search), ms per 1k tokens"]["bf16_over_fp32"] == pytest.approx(1 / 2.7)
    assert rows["LongMem perplexity of the 2,048-token document"]["bfloat16"] == pytest.approx(20.027)
    facts = machine_facts("float32", 2)
    assert facts["dtype"] == "float32" and facts["dtype_reason"] == "float32, as asked"
    table = markdown({"machine": {**facts, "dtype_reason": "bfloat16, chosen automatically: ..."},
                      "rows": list(rows.values())})
    assert "| memorize (ingestion), tok/s | 2,700 | 1,000 | 2.70x (bf16 better) |" in table
    assert "| retrieval (memory search), ms per 1k tokens | 18.52 | 50.00 | 0.37x (bf16 better) |" in table
    assert "| LongMem perplexity of the 2,048-token document | 20.03 | 20.01 | 1.00x |" in table  # no better/worse


def quick_run(module: str, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m <module> --quick --out F [args]`` in a child process: (the process, the JSON it wrote)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", module, "--quick", "--out", str(out), *args], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.shared_data  # its default text is a book of the shared data
def test_quick_benchmark_runs_end_to_end(tmp_path):
    proc, res = quick_run("longmem.bench.inference", tmp_path)
    assert set(res["targets"]) == {"memorize_tok_s", "retrieval_fraction", "score_speedup", "score_peak_rss_lower",
                                   "generation_ratio"}
    assert all(t["value"] > 0 for t in res["targets"].values())
    assert "| memorize (ingestion), tok/s |" in proc.stdout


@pytest.mark.heavy
@pytest.mark.integration
def test_one_scenario_run_alone_writes_its_json_where_told(tmp_path):
    """``python -m longmem.bench.bank --scenario NAME --out F`` (how the notes time one scenario) writes the JSON it
    prints, not only a whole run does; the real backbone ingests a short text."""
    out, book, work = tmp_path / "ingest.json", tmp_path / "captain.txt", tmp_path / "work"
    book.write_text("The captain's wife kept the house on the hill above the creek. " * 200, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "longmem.bench.bank", "--scenario", "ingest", "--work",
                           str(work), "--text", str(book), "--ingest-tokens", "2048", "--reps", "1", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res == json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["tokens"] == 2048 and res["ingest_tok_s"] > 0


def test_one_scenario_alone_without_work_is_refused_by_name(capsys):
    from longmem.bench.bank import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--scenario", "answer"])
    assert "--scenario needs --work" in capsys.readouterr().err


# -- a library in one bank (bench.library) --------------------------------------------------------------------------

def write_set(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_library_takes_its_books_and_questions_from_a_set_in_turn(tmp_path):
    from longmem.bench.library import library_books, questions_for

    qs = write_set(tmp_path / "set.jsonl", [
        {"book": "a.txt", "question": "a1", "answers": ["x"]}, {"book": "a.txt", "question": "a2", "answers": ["x"]},
        {"book": "b.txt", "question": "b0", "answers": []},  # unanswerable: not asked
        {"book": "b.txt", "question": "b1", "answers": ["y"]}, {"book": "c.txt", "question": "c1", "answers": ["z"]}])
    assert library_books(qs, 2) == ["a.txt", "b.txt"]
    assert questions_for(qs, ["a.txt", "b.txt"], 3) == ["a1", "b1", "a2"]
    with pytest.raises(SystemExit, match="asks about 3 books"):
        library_books(qs, 4)


def test_a_malformed_set_and_bad_sizes_are_refused_by_name(tmp_path, capsys):
    from longmem.bench.library import parse_args, read_set

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"book": "a.txt", "question": "q", "answers": ["x"]}\n{"book": "a.txt"}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match="bad.jsonl, line 2"):
        read_set(bad)
    good = write_set(tmp_path / "good.jsonl", [{"book": "a.txt", "question": "q", "answers": ["x"]}])
    for argv, message in [(["--tokens", "10000000,1000000"], "the smaller first"), (["--tokens", "1M,10M"],
                                                                                     "whole numbers"),
                          (["--set", str(tmp_path / "none.jsonl")], "no question set"),
                          (["--scenario", "measure"], "needs --work and --bank")]:
        with pytest.raises(SystemExit):
            parse_args(argv + (["--set", str(good)] if "--set" not in argv else []))
        assert message in capsys.readouterr().err
    args = parse_args(["--quick", "--set", str(good)])
    assert args.sizes == [131072, 524288] and args.questions == 4


def test_a_report_prints_json_then_the_table_and_writes_the_json(tmp_path, capsys):
    from longmem.util.report import print_report

    result = {"wall_s": 1.5, "rows": [1, 2]}
    assert print_report(result, "| a |\n| --- |", tmp_path / "out.json") is result
    printed = capsys.readouterr().out
    head, table = printed.split("\n\n", 1)
    assert json.loads(head) == result and table == "| a |\n| --- |\n"
    assert json.loads((tmp_path / "out.json").read_text()) == result


# -- what the machine could do (bench.limits) -------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_ingestion_work_is_counted_from_the_model_s_own_weights(family):
    import torch
    from tiny import tiny_model

    from longmem.bench.limits import ingest_flops

    model = tiny_model(family)
    spec, n, T = model.backbone.spec, model.cached_layer, model.segment_len
    flops = ingest_flops(model)
    weights = sum(p.numel() for layer in list(model.backbone.layers)[:n] for p in layer.parameters() if p.dim() == 2)
    assert flops.linear == 2 * weights and flops.layers == n > 0
    assert flops.attention == n * 4 * spec.n_heads * spec.head_dim * (T + 1) / 2
    assert flops.kv == 4 * spec.hidden * spec.n_kv_heads * spec.head_dim
    assert flops.per_token == flops.linear + flops.attention + flops.kv
    # the weight matmuls dominate: a layer's projections and MLP, not its norms
    dense = 2 * sum(m.weight.numel() for layer in list(model.backbone.layers)[:n] for m in layer.modules()
                    if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")
    assert flops.linear == dense


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_matmul_rate_is_measured_on_the_model_s_shapes_and_dtype(family, dtype):
    import torch
    from tiny import tiny_model

    from longmem.bench.limits import ingest_flops, matmul_rate, share

    model = tiny_model(family, dtype=getattr(torch, dtype))
    rate = matmul_rate(model, batch_segments=2, min_seconds=0.05, blocks=2)
    assert rate.gflops > 0 and rate.rows == 2 * model.segment_len and rate.dtype == dtype
    assert 0 < rate.mean_gflops <= rate.gflops * (1 + 1e-9)  # over all the blocks: never above the best one
    assert len(rate.shapes) == sum(1 for p in model.backbone.layers[0].parameters() if p.dim() == 2)
    flops = ingest_flops(model)
    assert share(rate.gflops * 1e9 / flops.per_token, flops, rate) == pytest.approx(1.0)  # the rate itself: 100%


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_attention_kernel_s_rate_bounds_the_share_below_one(dtype):
    """The attention rate is timed on the model's own attention shapes; the ceiling is 1 when attention runs at the
    matmul rate, below 1 when slower, and it weighs attention by its part of the work."""
    import dataclasses

    import torch
    from tiny import tiny_model

    from longmem.bench.limits import attention_rate, ceiling, ingest_flops, matmul_rate

    model = tiny_model(dtype=getattr(torch, dtype))
    spec = model.backbone.spec
    attention = attention_rate(model, min_seconds=0.05, blocks=2)
    assert attention.gflops > 0 and attention.dtype == dtype
    assert attention.shapes == [(spec.n_heads, model.segment_len, spec.head_dim)]
    flops, rate = ingest_flops(model), matmul_rate(model, min_seconds=0.05, blocks=2)
    assert ceiling(flops, rate, dataclasses.replace(attention, gflops=rate.gflops)) == pytest.approx(1.0)
    half = ceiling(flops, rate, dataclasses.replace(attention, gflops=rate.gflops / 2))  # attention twice as slow
    share_of_attention = flops.attention / flops.per_token
    assert half == pytest.approx(1 / (1 + share_of_attention))


def test_a_segment_s_profile_names_its_ops_and_the_matmul_share():
    from tiny import tiny_model

    from longmem.bench.limits import profile_segment

    prof = profile_segment(tiny_model(), reps=1, top=5)
    assert prof["segment_s"] > 0 and 0 < prof["matmul_share"] <= 1 and len(prof["top"]) == 5
    shares = [t["share"] for t in prof["top"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-9  # the costliest first
    assert any(t["op"] in ("aten::mm", "aten::addmm", "aten::bmm") for t in prof["top"])


@pytest.mark.heavy
def test_the_gpu_benchmark_runs_its_three_measures_on_the_cpu_at_quick_sizes(tmp_path, capsys):
    """``make gpu-check``'s benchmark, at its small sizes on the CPU: the same code the GPU runs."""
    from longmem.bench.gpu import QUICK, main

    out = tmp_path / "gpu.json"
    assert main(["--device", "cpu", "--quick", "--dtype", "float32", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["dtype"] == "float32" and res["sizes"] == "quick"
    assert res["memorize"]["tokens"] == QUICK["memorize_tokens"] and res["memorize"]["tok_s"] > 0
    assert res["answer"]["bank_tokens"] >= QUICK["bank_tokens"] and res["answer"]["search"] == "faiss, CPU"
    assert res["answer"]["first_token_s"] > 0 and res["answer"]["decode_ms_per_token"] > 0
    assert res["train"]["tok_s"] > 0 and res["train"]["trainable_params"] > 0
    assert res["sidenet"]["cached_layer"] == 18  # shaped as the shipped SideNet
    assert "| first answer token, " in capsys.readouterr().out


def test_the_recall_probe_finds_all_when_every_list_is_probed_and_less_with_fewer():
    from longmem.bench.recall import head_recall

    g = torch.Generator().manual_seed(0)
    keys = torch.randn(4000, 8, generator=g)
    sinks = torch.tensor([0, 1000, 2000])
    keys[sinks] = 10.0  # sink chunks: they would win every query, but are left out as the app's search leaves them
    queries = torch.randn(50, 8, generator=g)
    got = head_recall(keys, sinks, queries, n_chunks=16, lists=32, probes=[1, 32])
    assert got[32]["recall"] == [1.0] * 50 and all(abs(s - 1.0) < 1e-6 for s in got[32]["scored"])
    assert 0 < sum(got[1]["recall"]) / 50 < 0.9 and max(got[1]["scored"]) < 0.5


def test_the_recall_probe_refuses_a_bad_question_count(capsys):
    from longmem.bench.recall import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--work", "w", "--bank", "b", "--questions", "0"])
    assert "--questions must be >= 1" in capsys.readouterr().err


def test_the_benchmarks_see_each_memory_search_with_its_queries_and_time():
    from longmem.bench.library import watch_searches
    from longmem.memory.memory import Memory

    memory = Memory(2, 8, chunk_size=4, capacity=None, dtype=torch.float32)
    memory.add(torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8))
    seen = []
    watch_searches(memory, lambda queries, n_chunks, seconds: seen.append((tuple(queries.shape), n_chunks, seconds)))
    q = torch.randn(1, 4, 3, 8)
    assert memory.search(q, 2).chunk_ids.shape == (1, 4, 3, 2) and memory.select(q, 3) is not None
    assert [(s, n) for s, n, _ in seen] == [((1, 4, 3, 8), 2), ((1, 4, 3, 8), 3)] and all(t >= 0 for *_, t in seen)


# -- kill -9 mid-ingest (bench.crash) --------------------------------------------------------------------------------

CRASH_WORKER = """
import sys
from tiny import tiny_model
from longmem.bench.crash import TITLE
from longmem.ingest.pipeline import ingest
from longmem.storage import BankDirectory
ingest(BankDirectory(sys.argv[1]).open(sys.argv[2]), tiny_model("llama", segment_len=32), sys.argv[3], title=TITLE)
"""


@pytest.mark.heavy
def test_the_crash_benchmark_kills_an_ingestion_once_its_segments_are_committed(tmp_path, monkeypatch):
    from helpers import child_env
    from test_bank import book
    from tiny import tiny_model

    from longmem.bench.crash import TITLE, committed, kill_mid_ingest
    from longmem.storage import BankDirectory

    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    directory = BankDirectory(tmp_path / "banks")
    directory.create("lib", tiny_model("llama", segment_len=32)).close()
    text = tmp_path / "long.txt"
    text.write_text(book(24000))
    db = directory.path("lib") / "bank.db"
    seen, seconds = kill_mid_ingest([sys.executable, "-c", CRASH_WORKER, str(directory.root), "lib", str(text)],
                                    db, 30, timeout=120)
    assert seen >= 30 and seconds > 0 and committed(db, TITLE) >= seen
    with directory.open("lib") as bank:
        (doc,) = bank.documents()
        assert doc.title == TITLE and doc.status == "ingesting" and doc.n_segments < 24000 // 32
        assert bank.verify().ok


def test_the_crash_benchmark_refuses_bad_arguments_by_name(tmp_path, capsys):
    from longmem.bench.crash import parse_args, scenario

    with pytest.raises(SystemExit):
        parse_args(["--work", "w", "--after", "-1"])
    assert "--after must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no bank 'library-10000000'.*build it"):
        scenario(parse_args(["--work", str(tmp_path)]))


@pytest.mark.heavy
def test_the_classifier_benchmark_builds_and_classifies_through_the_workspace(tmp_path):
    """The Classify tab's path at quick sizes, on the shipped model and the app's sample of reviews (no shared data
    needed: a fresh clone runs it)."""
    sample = Path(__file__).parents[1] / "app" / "samples" / "reviews.csv"
    proc, res = quick_run("longmem.bench.classifier", tmp_path, "--file", str(sample))
    assert res["examples"] == 200 and res["texts"] == 20 and res["set"] == str(sample)
    assert res["build_s"] > 0 and res["head_from_scratch_s"] > 0
    assert 0 < res["one_call_median_s"] <= res["one_call_max_s"] and res["file_s_per_text"] > 0
    assert 0.6 <= res["cv_accuracy"] <= 1  # sentiment from 200 examples: far above chance, not a record
    assert "| classify one text (one call, median of 10) |" in proc.stdout
