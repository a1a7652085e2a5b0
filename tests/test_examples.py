"""The scripts in ``examples/`` run as a user runs them (their own process, the demo assets, a few steps)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

from trl_padfree._compat import dpo_padding_free_unavailable, rl_padding_free_unavailable


def run_example(name: str, out: Path) -> subprocess.CompletedProcess:
    """``python examples/NAME --max_steps 3 --output_dir OUT`` as a user runs it: its own process, in a directory
    outside the checkout, offline, one CPU thread."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), "--max_steps", "3", "--output_dir", str(out)],
                          cwd=out.parent, env=env, capture_output=True, text=True, timeout=600)


def test_sft_padfree_example_trains_and_saves(tmp_path):
    out = tmp_path / "out"
    proc = run_example("sft_padfree.py", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line for line in lines if "packing probe" in line] == [
        next(line for line in lines if line.startswith("[trl-padfree] packing probe: llama with 'padfree' keeps"))
    ]
    assert re.fullmatch(rf"train loss \d+\.\d{{3}} over 3 steps; saved to {re.escape(str(out))}", lines[-1])
    assert "Warning" not in proc.stderr  # no UserWarning / FutureWarning from the settings the example uses
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
    assert (out / "model.safetensors").is_file()


@pytest.mark.skipif(dpo_padding_free_unavailable() is not None, reason=str(dpo_padding_free_unavailable()))
def test_dpo_padfree_example_trains_and_saves(tmp_path):
    out = tmp_path / "out"
    proc = run_example("dpo_padfree.py", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("[trl-padfree] preference probe (prompt-once): llama with 'padfree' keeps") for line in lines)
    assert re.fullmatch(rf"train loss \d+\.\d{{3}} over 3 steps, reward accuracy \d\.\d\d; saved to {re.escape(str(out))}",
                        lines[-1])
    assert "temporarily unavailable" not in proc.stderr + proc.stdout  # TRL's padding-free fallback did not run
    assert (out / "model.safetensors").is_file()


@pytest.mark.skipif(rl_padding_free_unavailable() is not None, reason=str(rl_padding_free_unavailable()))
def test_grpo_padfree_example_trains_and_saves(tmp_path):
    out = tmp_path / "out"
    proc = run_example("grpo_padfree.py", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("[trl-padfree] RL probe (prompt-once): llama with 'padfree' keeps") for line in lines)
    forwarded, padded = map(int, re.fullmatch(r"forwarded (\d+) of (\d+) padded tokens \(no-grad forwards\)",
                                              lines[-2]).groups())
    assert 0 < forwarded < padded
    assert re.fullmatch(rf"train loss -?\d+\.\d{{3}} over 3 steps, mean reward \d\.\d\d first, \d\.\d\d last; saved to "
                        rf"{re.escape(str(out))}", lines[-1])
    assert (out / "model.safetensors").is_file()
