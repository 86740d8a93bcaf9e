"""The benchmark's bookkeeping (targets) on fixed numbers, and a real quick run on purpose (-m slow)."""

import json
import subprocess
import sys

import pytest

from longmem.bench import target


def test_target_directions():
    assert target(1400.0, 1300.0, True)["met"] and not target(1200.0, 1300.0, True)["met"]
    assert target(0.2, 0.25, False)["met"] and not target(0.3, 0.25, False)["met"]
    assert target(0.3, 0.25, False, doc_tokens=8192)["doc_tokens"] == 8192


@pytest.mark.slow
@pytest.mark.integration
def test_quick_benchmark_runs_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "longmem.bench", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["targets"]) == {"memorize_tok_s", "retrieval_fraction", "score_speedup", "score_peak_rss_lower",
                                   "generation_ratio"}
    assert all(t["value"] > 0 for t in res["targets"].values())
    assert "| memorize (ingestion), tok/s |" in proc.stdout
