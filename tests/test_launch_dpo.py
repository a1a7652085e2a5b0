"""``trl-padfree dpo`` end to end on CPU (48 demo pairs, batches of 4): a run, SIGTERM + resume, bad input, preview;
2 ranks: test_launch_grpo.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_inputs import DPO_STEPS, dpo_argv, write_preference_data
from launch_runs import (
    assert_real_tokens_logged,
    assert_refused_in_one_line,
    assert_stop_and_resume,
    log_history,
    run_launch,
    run_preview,
    write_jsonl,
)
from paths import CONFIGS, DEMO_MODEL


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_preference_data(tmp_path_factory.mktemp("dpo-data"))


@pytest.fixture(scope="module")
def full_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("dpo-full") / "out"
    code, stdout, stderr = run_launch(dpo_argv(data_dir, out), "dpo")
    assert code == 0, (stdout + stderr)[-3000:]
    return out, stdout


def preview(train_file: Path) -> list[str]:
    code, stdout, stderr = run_preview(["--config", str(CONFIGS / "demo-dpo.yaml"), "--train_file", str(train_file),
                                        "--model_name_or_path", str(DEMO_MODEL), "-n", "1"])
    assert code == 0, stderr
    return stdout.splitlines()


def test_demo_config_trains_saves_and_summarises(full_run):
    out, stdout = full_run
    assert (out / "model.safetensors").is_file()
    assert "[trl-padfree] run: " in stdout and "padding_free=True" in stdout and "attn_implementation=padfree" in stdout
    assert "[trl-padfree] data: 48 training pairs" in stdout and "(format: prompt/chosen/rejected)" in stdout
    assert "[trl-padfree] reference model: a second copy of the starting weights" in stdout
    assert "keeps packed examples apart" in stdout  # the preference probe ran before the first step
    assert f"[trl-padfree] steps: {DPO_STEPS}/{DPO_STEPS} in " in stdout and "[trl-padfree] eval reward accuracy: " \
        in stdout
    assert_real_tokens_logged(out, stdout)
    steps = [e for e in log_history(out) if "loss" in e]
    assert [e["step"] for e in steps] == list(range(1, DPO_STEPS + 1))
    for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                "logps/rejected", "num_tokens"):
        assert all(key in e for e in steps), key
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["global_step"] == DPO_STEPS and summary["saved_to"] == str(out)


def test_sigterm_saves_a_checkpoint_and_resume_reproduces_the_run(full_run, data_dir, tmp_path):
    assert_stop_and_resume("dpo", dpo_argv(data_dir, tmp_path, "--eval_strategy", "no"), tmp_path, 3, full_run[0])


def test_records_without_rejected_are_refused(tmp_path, data_dir):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "hi", "chosen": " there"}])
    assert_refused_in_one_line("dpo", dpo_argv(data_dir, tmp_path / "out", "--train_file", str(bad)), tmp_path / "out",
                               "preference records need 'chosen' and 'rejected'")


def test_preview_shows_what_is_scored_in_chosen_and_rejected(tmp_path):
    lines = preview(write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "### Question: What is 2 + 3?\n### Answer:",
                                                             "chosen": " 5", "rejected": " I do not know."}]))
    assert lines[1:5] == ["chosen:   ### Question: What is 2 + 3?", "### Answer:[[ 5<|eos|>]]",
                          "rejected: ### Question: What is 2 + 3?", "### Answer:[[ I do not know.<|eos|>]]"]
    assert lines[6].startswith("scored tokens: chosen ") and lines[6].endswith(
        "in 1 pairs (format: prompt/chosen/rejected)") and lines[7].startswith("prompt_once forwards ")


def test_conversational_pairs_train_and_preview(tmp_path, data_dir):
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
             "chosen": [{"role": "assistant", "content": str(i + 1)}],
             "rejected": [{"role": "assistant", "content": "I do not know."}]} for i in range(16)]
    pairs = write_jsonl(tmp_path / "chat.jsonl", rows)
    argv = dpo_argv(data_dir, tmp_path / "out", "--train_file", str(pairs), "--eval_strategy", "no", "--max_steps", "2")
    code, stdout, stderr = run_launch(argv, "dpo")
    assert code == 0, (stdout + stderr)[-3000:]
    assert "(format: conversational)" in stdout and "[trl-padfree] steps: 2/2" in stdout
    shown = "\n".join(preview(pairs))
    assert "[[" in shown and "I do not know." in shown
