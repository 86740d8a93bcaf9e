"""The benchmarks' bookkeeping (targets, the dtype comparison) on fixed numbers, and a real quick run on purpose
(-m slow)."""

import json
import subprocess
import sys

import pytest

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


@pytest.mark.slow
@pytest.mark.integration
def test_quick_benchmark_runs_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "longmem.bench.inference", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["targets"]) == {"memorize_tok_s", "retrieval_fraction", "score_speedup", "score_peak_rss_lower",
                                   "generation_ratio"}
    assert all(t["value"] > 0 for t in res["targets"].values())
    assert "| memorize (ingestion), tok/s |" in proc.stdout


def test_a_report_prints_json_then_the_table_and_writes_the_json(tmp_path, capsys):
    from longmem.util.report import print_report

    result = {"wall_s": 1.5, "rows": [1, 2]}
    assert print_report(result, "| a |\n| --- |", tmp_path / "out.json") is result
    printed = capsys.readouterr().out
    head, table = printed.split("\n\n", 1)
    assert json.loads(head) == result and table == "| a |\n| --- |\n"
    assert json.loads((tmp_path / "out.json").read_text()) == result
