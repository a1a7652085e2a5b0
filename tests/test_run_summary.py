"""What a ``trl-padfree train`` run reports: the summary (also after a resume), the token counts with
``pad_to_multiple_of``, the model card. Logs every 3 steps and checkpoints every 4, so both fall between logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_hooks import SigtermAtStep
from launch_runs import log_history, losses, run_launch
from paths import CONFIGS, DEMO, DEMO_MODEL

from trl_padfree.launch import load_config
from trl_padfree.launch.tasks.sft_data import prepare_data

STEPS, BATCH, EXAMPLES, MULTIPLE = 7, 4, 28, 64  # one epoch: every example is trained exactly once


def run(output_dir: Path, *extra: str, callbacks=()) -> str:
    argv = ["--config", str(CONFIGS / "demo.yaml"), "--model_name_or_path", str(DEMO_MODEL), "--train_file",
            str(DEMO / "data" / "train.jsonl"), "--eval_file", "", "--eval_strategy", "no", "--eval_on_start", "false",
            "--max_train_examples", str(EXAMPLES), "--per_device_train_batch_size", str(BATCH), "--max_steps",
            str(STEPS), "--warmup_steps", "0", "--learning_rate", "2e-3", "--logging_steps", "3", "--save_strategy",
            "steps", "--save_steps", "4", "--pad_to_multiple_of", str(MULTIPLE), "--output_dir", str(output_dir),
            *extra]
    code, stdout, stderr = run_launch(argv, "sft", callbacks)
    assert code == 0, (stdout + stderr)[-3000:]
    return stdout


def summary(out: Path) -> dict:
    return json.loads((out / "launch_summary.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("whole") / "out"
    return out, run(out)


def test_the_summary_train_loss_is_transformers_mean_over_every_step(whole_run):
    out, stdout = whole_run
    result = summary(out)
    # transformers' own train_loss: every step's loss summed over the steps this (only) process ran
    assert result["train_loss_this_process"] == pytest.approx(result["train_loss"], rel=1e-6)
    assert "train_loss" not in result["metrics"]  # one meaning per key: the whole run's is the top-level one
    assert result["train_loss_steps"] == STEPS and result["steps_this_process"] == STEPS
    assert f"[trl-padfree] steps: {STEPS}/{STEPS} in " in stdout
    assert (f"[trl-padfree] train loss: {result['train_loss']:.4f} (mean over the run's {STEPS} steps), last logged "
            in stdout)
    assert sorted(losses(out)) == [3, 4, 6, 7]  # every 3 steps, the checkpoint, the end


def test_a_resumed_run_reports_the_whole_run_and_the_steps_it_ran(whole_run, tmp_path):
    out = tmp_path / "out"
    run(out, callbacks=[SigtermAtStep(5)])
    assert (out / "checkpoint-5").is_dir() and summary(out)["global_step"] == 5
    assert summary(out)["train_loss_steps"] == 5  # the stop logged its step: the checkpoint covers steps 1-5
    stdout = run(out, "--resume_from_checkpoint", str(out / "checkpoint-5"))
    resumed, uninterrupted = summary(out), summary(whole_run[0])
    assert resumed["steps_this_process"] == STEPS - 5 and resumed["train_loss_steps"] == STEPS
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-5)
    assert "train_loss" not in resumed["metrics"]
    # transformers' figure for this process alone: the mean of steps 6-7 (logged at 6 and 7), not the run's
    logged = losses(out)
    assert resumed["train_loss_this_process"] == pytest.approx((logged[6] + logged[7]) / 2, rel=1e-4)
    assert resumed["train_loss_this_process"] != pytest.approx(uninterrupted["train_loss"], rel=1e-3)
    assert (f"[trl-padfree] steps: {STEPS}/{STEPS}, {STEPS - 5} of them in this process (resumed at step 5), in "
            in stdout)
    assert f"[trl-padfree] train loss: {resumed['train_loss']:.4f} (mean over the run's {STEPS} steps)" in stdout


def test_the_padding_segment_of_pad_to_multiple_of_is_no_real_token(whole_run, demo_tokenizer):
    out, _ = whole_run
    cfg = load_config(["--config", str(CONFIGS / "demo.yaml"), "--model_name_or_path", str(DEMO_MODEL),
                       "--train_file", str(DEMO / "data" / "train.jsonl"), "--max_train_examples", str(EXAMPLES),
                       "--pad_to_multiple_of", str(MULTIPLE)], check_environment=False)
    lengths = [len(ids) for ids in prepare_data(cfg, demo_tokenizer).train["input_ids"]]
    assert len(lengths) == EXAMPLES == STEPS * BATCH
    metrics = summary(out)["metrics"]
    assert metrics["train_real_tokens"] == sum(lengths)  # not the rows' lengths, padded to multiples of 64
    # a padded batch of 4 examples, padded to the longest and rounded up to the multiple, as the collator counts it
    assert metrics["train_padded_tokens"] % (BATCH * MULTIPLE) == 0
    assert metrics["train_padded_tokens"] >= BATCH * MULTIPLE * STEPS
    assert all(0.0 < e["padding_share"] < 1.0 for e in log_history(out) if "loss" in e)


def test_the_model_card_names_the_local_base_model_and_where_to_load_it(whole_run):
    out, _ = whole_run
    card = (out / "README.md").read_text(encoding="utf-8")  # TRL writes it with each checkpoint
    assert "[None]" not in card and 'model="None"' not in card
    assert f"This model is a fine-tuned version of the local model `{DEMO_MODEL}`." in card
    assert f'generator = pipeline("text-generation", model="{out}", ' in card  # device= or device_map= by TRL version
