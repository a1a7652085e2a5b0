"""The launch's ``scored_lm_head`` reaches the trainer of every task with an LM head; the run line and summary say it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_runs import HeadSeen, run_launch, write_short_demo_records
from paths import CONFIGS, DEMO, DEMO_MODEL

ONE_STEP = ["--max_steps", "1", "--max_train_examples", "8", "--eval_strategy", "no", "--eval_on_start", "false",
            "--save_strategy", "no", "--logging_steps", "1"]


def argv(task: str, data: Path, out: Path) -> list[str]:
    config, train = {
        "sft": ("demo.yaml", DEMO / "data" / "train.jsonl"),
        "dpo": ("demo-dpo.yaml", DEMO / "data" / "pref_train.jsonl"),
        "grpo": ("demo-grpo.yaml", data),
        "kto": ("demo-kto.yaml", DEMO / "data" / "pref_train.jsonl"),
    }[task]
    extra = {"sft": [], "dpo": ["--per_device_train_batch_size", "4"], "kto": ["--per_device_train_batch_size", "4"],
             "grpo": ["--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "4"]}
    return ["--config", str(CONFIGS / config), "--model_name_or_path", str(DEMO_MODEL), "--train_file", str(train),
            "--output_dir", str(out), *ONE_STEP, *extra[task]]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_short_demo_records(tmp_path_factory.mktemp("head-data") / "prompts.jsonl", "pref_train.jsonl", 8,
                                    shorter_than=300)


@pytest.mark.parametrize("task", ["sft", "dpo", "grpo", "kto"])
@pytest.mark.parametrize("value", ["true", "false"])
def test_scored_lm_head_reaches_the_trainer(task, value, prompts, tmp_path):
    seen = HeadSeen()
    code, stdout, stderr = run_launch([*argv(task, prompts, tmp_path / "out"), "--scored_lm_head", value], task, [seen])
    assert code == 0, (stdout + stderr)[-3000:]
    assert seen.states == (["scored"] if value == "true" else [None])
    run_line = next(line for line in stdout.splitlines() if line.startswith("[trl-padfree] run: "))
    assert f"scored_lm_head={value.capitalize()}" in run_line, run_line
    summary = json.loads((tmp_path / "out" / "launch_summary.json").read_text())
    assert summary["scored_lm_head"] is (value == "true")
