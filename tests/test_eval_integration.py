"""``longmem eval all --quick`` on the real default backbone and shipped SideNet, with the shared data: every suite
runs, writes its JSON, markdown and plots, and the results document names the command, commit and hardware."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from longmem.cli.eval import main
from longmem.eval import SUITES

pytestmark = [pytest.mark.integration, pytest.mark.shared_data]


def finite_numbers(obj) -> list[float]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [obj]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in finite_numbers(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in finite_numbers(v)]
    return []


def test_eval_all_quick_writes_every_suite_and_the_results_document(tmp_path, capsys):
    out, docs = tmp_path / "out", tmp_path / "docs" / "results.md"
    assert main(["all", "--quick", "--out", str(out), "--docs", str(docs)]) == 0
    printed = capsys.readouterr().out
    text = docs.read_text()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert "Hardware: " in text and "LongMem SideNet: shipped with the package (K = 1024" in text
    for name in SUITES:
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} | "))
        assert f" | `longmem eval all --quick --out {out} --docs {docs}` | `{commit}`" in row
        assert " | reduced: " in row or " | full | " in row
        result = json.loads((out / f"{name}.json").read_text())
        assert result["suite"] == name and result["seconds"] > 0
        assert result["title"] in text and result["title"] in printed
        numbers = [x for x in finite_numbers(result["data"]) if x == x]  # NaN aside (std of one seed)
        assert numbers and all(math.isfinite(x) for x in numbers), name
        for plot in result["plots"]:
            assert (out / plot).stat().st_size > 1000 and (docs.parent / "results" / plot).is_file()
    books = json.loads((out / "books.json").read_text())["data"]["results"]
    assert set(books) == {"backbone_1k", "backbone_full", "longmem", "longmem_empty"}
    for r in books.values():  # a real model on real text: perplexity far below the 49k-token vocabulary
        assert all(1 < s["ppl"] < 200 for s in r["splits"].values())
    squad = json.loads((out / "squad.json").read_text())
    assert {r["model"] for r in squad["data"]["runs"]} == {"backbone_1k", "backbone_full", "longmem", "longmem_empty"}
    assert any("LongMem with its memory empty (the SideNet alone) moves the 1k backbone's" in n for n in squad["notes"])
    icl = json.loads((out / "icl.json").read_text())["data"]["runs"]
    assert {r["model"] for r in icl} == {"majority", "backbone_1k", "backbone_full", "longmem", "longmem_empty",
                                         "longmem@40", "longmem_fused", "longmem_fused@40", "backbone_1k_lexical",
                                         "embeddings_lr", "embeddings_lr@40", "longmem_head", "longmem_head@40"}
    assert all(0 <= r[p] <= 1 and r["n"] == 8 for r in icl for p in ("label", "calibrated"))
    assert (out / "icl-curve.png").stat().st_size > 1000 and (out / "icl.tasks.jsonl").is_file()
