"""Running the launch from the tests, in this process (``run_launch``, ``run_preview``) or as the command
(``run_command``), what a run leaves, and the demo's records; faults a run can be given: tests/launch_hooks.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from paths import DEMO, DEMO_MODEL, ROOT
from transformers import TrainerCallback
from two_ranks import free_port

from trl_padfree.launch import main


def _captured(function: typing.Callable[..., int], *args: Any, **kwargs: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = function(*args, **kwargs)
    return code, out.getvalue(), err.getvalue()


def run_launch(argv: list[str], task: str, callbacks: typing.Sequence[TrainerCallback] = ()) -> tuple[int, str, str]:
    """``trl-padfree TASK ARGV`` in this process: (exit code, stdout, stderr)."""
    return _captured(main, argv, callbacks, task=task)


def run_preview(argv: list[str]) -> tuple[int, str, str]:
    from trl_padfree.launch.preview import main as preview_main

    return _captured(preview_main, argv)


def assert_refused_in_one_line(task: str, argv: list[str], out: Path, message: str = "",
                               before_model: bool = False) -> str:
    """``trl-padfree TASK ARGV`` (or ``preview``) exits 2 with one line ``trl-padfree TASK: error: ...`` naming
    ``message``, writes nothing to ``out`` (``before_model``: loads no model); returns the line without the prefix."""
    code, stdout, stderr = run_preview(argv) if task == "preview" else run_launch(argv, task)
    prefix = f"trl-padfree {'train' if task == 'sft' else task}: error: "
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, stdout[-2000:] + stderr[-2000:]
    assert lines[0].startswith(prefix) and message in lines[0] and "Traceback" not in stdout, stderr
    assert not before_model or "loading model" not in stdout
    assert not out.exists()  # nothing written
    return lines[0].removeprefix(prefix)


def demo_pairs_argv(config: Path, out: Path, *extra: str) -> list[str]:
    """``config`` on the demo model and preference pairs, into ``out``: 4 steps on 32 training pairs, logged and
    evaluated on 8 eval pairs every 2 steps; ``extra`` last."""
    return ["--config", str(config), "--model_name_or_path", str(DEMO_MODEL), "--train_file",
            str(DEMO / "data" / "pref_train.jsonl"), "--eval_file", str(DEMO / "data" / "pref_eval.jsonl"),
            "--output_dir", str(out), "--max_steps", "4", "--max_train_examples", "32", "--max_eval_examples", "8",
            "--logging_steps", "2", "--eval_steps", "2", *extra]


def run_command(task: str, argv: list[str], *, ranks: int = 1, timeout: int = 240,
                cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``trl-padfree TASK ARGV`` in a subprocess (under torchrun with ``ranks`` > 1), one CPU thread each, offline."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    launcher = [sys.executable]
    if ranks > 1:
        env["PYTHONUNBUFFERED"] = "1"
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
                    free_port()]
    return subprocess.run([*launcher, "-m", "trl_padfree.cli", task, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def log_history(out: Path) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def losses(out: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in log_history(out) if "loss" in e}


def run_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("[trl-padfree] run: "))


def assert_real_tokens_logged(out: Path, stdout: str, generation: bool = False) -> dict:
    """Every training log has real tokens/s (GRPO/RLOO: and the generation share), the run's are TRL's
    ``num_tokens``, and the summary prints them; returns the end-of-training entry."""
    history = log_history(out)
    train = [e for e in history if "loss" in e]
    assert train and all(e["real_tokens_per_second"] > 0 for e in train), train
    end = next(e for e in history if "train_runtime" in e)
    assert end["train_real_tokens"] == train[-1]["num_tokens"] > 0
    lines = stdout.splitlines()
    assert f"[trl-padfree] real tokens/s: {end['train_real_tokens_per_second']:,.0f}" in lines
    if generation:
        assert all(e["generation_seconds"] > 0 and 0 < e["generation_share"] < 1 for e in train), train
        assert 0 < end["train_generation_share"] < 1
        assert (f"[trl-padfree] generation: {end['train_generation_seconds']:.1f} s, "
                f"{100 * end['train_generation_share']:.1f}% of the training time") in lines
    else:
        assert not any("generation_seconds" in e for e in history)
    return end


def assert_stop_and_resume(task: str, argv: list[str], out: Path, step: int, whole: Path,
                           keys: tuple[str, ...] = ("loss",)) -> None:
    """``trl-padfree TASK ARGV`` into ``out``, stopped by SIGTERM at ``step``, saves checkpoint-STEP and no model;
    resumed (``resume_from_checkpoint: true``) it logs ``keys`` at every step as the whole run in ``whole`` did."""
    from launch_hooks import SigtermAtStep

    code, stdout, stderr = run_launch(argv, task, [SigtermAtStep(step)])
    assert code == 0, (stdout + stderr)[-3000:]
    assert "[trl-padfree] SIGTERM received: saving a checkpoint at the end of this step" in stdout
    assert f"[trl-padfree] checkpoint saved to {out / f'checkpoint-{step}'}" in stdout
    assert not (out / "model.safetensors").exists() and sorted(losses(out)) == list(range(1, step + 1))
    code, stdout, stderr = run_launch([*argv, "--resume_from_checkpoint", "true"], task)
    assert code == 0 and f"checkpoint-{step}" in stdout, (stdout + stderr)[-3000:]
    assert (out / "model.safetensors").is_file()
    expected, resumed = ({e["step"]: e for e in log_history(o) if "loss" in e} for o in (whole, out))
    assert sorted(resumed) == sorted(expected)
    for s in expected:
        for key in keys:
            assert resumed[s][key] == pytest.approx(expected[s][key], rel=1e-5, abs=1e-6), (s, key)


def demo_records(name: str, n: int | None = None) -> list[dict]:
    """The first ``n`` (all) records of the demo's ``data/NAME``."""
    lines = (DEMO / "data" / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


def write_short_demo_records(path: Path, name: str, n: int, shorter_than: int) -> Path:
    """The first ``n`` records of the demo's ``data/NAME`` whose line is shorter than ``shorter_than``, to ``path``."""
    lines = (DEMO / "data" / name).read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([line for line in lines if len(line) < shorter_than][:n]) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class HeadSeen(TrainerCallback):
    """The LM head's state (``scored_head_state``) of the model each training ends with."""

    def __init__(self) -> None:
        self.states: list[str | None] = []

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from trl_padfree.scored_head import scored_head_state  # (SFT adds it at the first step)

        self.states.append(scored_head_state(model))
