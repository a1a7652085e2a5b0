"""Running the launch (``trl-padfree train``, ``dpo``, ...) from the tests, in this process (``run_launch``) or as the
command (``run_command``), what a run leaves, and the demo's records; faults a run can be given: tests/launch_hooks.py."""

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


def assert_refused_in_one_line(task: str, argv: list[str], out: Path, message: str = "",
                               before_model: bool = False) -> str:
    """``trl-padfree TASK ARGV`` (TASK ``preview``: ``trl-padfree preview ARGV``) exits 2 with one line,
    ``trl-padfree TASK: error: ...`` naming ``message``, no traceback, and writes nothing to ``out`` (and,
    ``before_model``, loads no model); returns the line without that prefix."""
    code, stdout, stderr = run_preview(argv) if task == "preview" else run_launch(argv, task)
    prefix = f"trl-padfree {'train' if task == 'sft' else task}: error: "
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, stdout[-2000:] + stderr[-2000:]
    assert lines[0].startswith(prefix) and message in lines[0] and "Traceback" not in stdout, stderr
    assert not before_model or "loading model" not in stdout
    assert not out.exists()  # nothing written
    return lines[0].removeprefix(prefix)


def demo_pairs_argv(config: Path, out: Path, *extra: str) -> list[str]:
    """``config`` (``argv[1]``) on the demo model and preference pairs, into ``out``: 4 steps on 32 training pairs,
    logged and evaluated on 8 eval pairs every 2 steps; ``extra`` last."""
    return [
        "--config", str(config),
        "--model_name_or_path", str(DEMO_MODEL),
        "--train_file", str(DEMO / "data" / "pref_train.jsonl"),
        "--eval_file", str(DEMO / "data" / "pref_eval.jsonl"),
        "--output_dir", str(out),
        "--max_steps", "4", "--max_train_examples", "32", "--max_eval_examples", "8",
        "--logging_steps", "2", "--eval_steps", "2",
        *extra,
    ]  # fmt: skip


def run_preview(argv: list[str]) -> tuple[int, str, str]:
    """``trl-padfree preview ARGV`` in this process: (exit code, stdout, stderr)."""
    from trl_padfree.launch.preview import main as preview_main

    return _captured(preview_main, argv)


def run_command(task: str, argv: list[str], *, ranks: int = 1, timeout: int = 240,
                cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``trl-padfree TASK ARGV`` in a subprocess (under torchrun, on a free port, with ``ranks`` > 1), in ``cwd``,
    output into pipes, one CPU thread per process, offline, this checkout's code."""
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


def assert_real_tokens_logged(out: Path, stdout: str, generation: bool = False) -> dict:
    """Every training log of the run in ``out`` has real tokens/s (GRPO/RLOO: and the generation seconds and share),
    the run's real tokens are TRL's own count of them (``num_tokens``), and the summary prints the run's tokens/s
    (and the generation share); returns the end-of-training entry."""
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


def losses(out: Path) -> dict[int, float]:
    """The training loss of every logged step of the run in ``out``."""
    return {e["step"]: e["loss"] for e in log_history(out) if "loss" in e}


def demo_records(name: str, n: int | None = None) -> list[dict]:
    """The first ``n`` (all) records of the demo's ``data/NAME``."""
    lines = (DEMO / "data" / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


def write_short_demo_records(path: Path, name: str, n: int, shorter_than: int) -> Path:
    """The first ``n`` records of the demo's ``data/NAME`` whose line is shorter than ``shorter_than`` characters,
    written to ``path`` line for line."""
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
