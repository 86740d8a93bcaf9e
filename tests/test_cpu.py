"""longmem.model.cpu: the thread count and huge pages every entry point sets before it loads a model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longmem.model.cpu import THP_VARIABLE, setup_cpu

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# a fresh process: set up (or not), allocate 64 MB, print how much of it the kernel backs with huge pages
PROBE = """
import sys, torch
from longmem.model.cpu import setup_cpu
if sys.argv[1] == "setup":
    setup_cpu(1)
x = torch.ones(16 * 2**20)  # 64 MB of float32, touched
huge = [line for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages:")][0]
print(int(huge.split()[1]))
"""


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_setup_cpu_sets_threads_and_turns_huge_pages_on(monkeypatch, threads):
    monkeypatch.delenv(THP_VARIABLE, raising=False)
    setup_cpu(1)
    assert torch.get_num_threads() == 1
    assert os.environ[THP_VARIABLE] == "1"


def test_no_thread_count_keeps_torchs_and_a_users_choice_wins(monkeypatch, threads):
    monkeypatch.setenv(THP_VARIABLE, "0")
    before = torch.get_num_threads()
    setup_cpu(None)
    assert torch.get_num_threads() == before
    assert os.environ[THP_VARIABLE] == "0"


def _huge_kb(mode: str, env: dict) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not THP_MODE.exists() or "[madvise]" not in THP_MODE.read_text(),
                    reason="needs Linux transparent huge pages in 'madvise' mode (the only mode where asking matters)")
@pytest.mark.heavy
def test_large_tensors_get_huge_pages_only_when_set_up():
    env = {k: v for k, v in os.environ.items() if k != THP_VARIABLE}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    assert _huge_kb("setup", env) >= 32 * 1024  # most of the 64 MB tensor
    assert _huge_kb("plain", env) == 0
    assert _huge_kb("setup", {**env, THP_VARIABLE: "0"}) == 0  # the user's choice wins
