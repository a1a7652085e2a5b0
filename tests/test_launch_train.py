"""``trl-padfree train`` end to end on CPU: a run, SIGTERM + resume (same losses), LoRA, attention fallbacks."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from launch_inputs import TRAIN_STEPS, train_argv
from launch_runs import (
    assert_refused_in_one_line,
    assert_stop_and_resume,
    demo_records,
    log_history,
    run_launch,
    write_jsonl,
)
from tiny_models import GPT_NEO, MPT, save_tiny_model

from trl_padfree.launch import main


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 short demo records + one whose answer lies beyond max_length (so it is dropped), and 8 eval records."""
    out = tmp_path_factory.mktemp("launch-train-data")
    short = [r for r in demo_records("train.jsonl") if len(r["instruction"]) + len(r["output"]) < 160][:40]
    long_question = {"instruction": "Copy the text exactly: " + "red blue green " * 60, "output": "red blue green"}
    write_jsonl(out / "train.jsonl", short[:20] + [long_question] + short[20:])
    write_jsonl(out / "eval.jsonl", demo_records("eval.jsonl", 8))
    return out


@pytest.fixture(scope="module")
def full_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    import torch

    out = tmp_path_factory.mktemp("full") / "out"
    threads = torch.get_num_threads()
    code, stdout, stderr = run_launch(train_argv(data_dir, out), "sft")
    assert code == 0, (stdout + stderr)[-3000:]
    assert torch.get_num_threads() == threads  # the demo's torch_num_threads: 1 holds only during the run
    return out, stdout


def test_run_trains_saves_and_summarises(full_run):
    out, stdout = full_run
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["global_step"] == TRAIN_STEPS and summary["interrupted"] is None and summary["saved_to"] == str(out)
    for line in ("dropped 1 of 41 train examples with no trained token left",
                 "data: 40 training examples, 8 eval examples (format: template)",
                 f"steps: {TRAIN_STEPS}/{TRAIN_STEPS} in ", f"model saved to {out}", "padding avoided: ",
                 "real tokens/s: "):
        assert "[trl-padfree] " + line in stdout, line
    # evaluated at steps 3 and 6: each figure says which evaluation it is (the first is not "before training")
    history = log_history(out)
    evals = [e for e in history if "eval_loss" in e]
    assert [e["step"] for e in evals] == [3, 6]
    assert (f"[trl-padfree] eval loss: {evals[0]['eval_loss']:.4f} (step 3) -> {evals[-1]['eval_loss']:.4f} (step 6)"
            in stdout.splitlines())
    train_logs = [e for e in history if "loss" in e]
    assert [e["step"] for e in train_logs] == list(range(1, TRAIN_STEPS + 1))
    assert all(e["real_tokens_per_second"] > 0 and 0.0 <= e["padding_share"] < 1.0 for e in train_logs)
    final = history[-1]
    assert final["train_real_tokens"] > 0 and final["train_padded_tokens"] >= final["train_real_tokens"]
    assert final["train_padding_share"] == pytest.approx(1 - final["train_real_tokens"] / final["train_padded_tokens"],
                                                         abs=1e-4)


def test_sigterm_saves_a_checkpoint_and_resume_matches(full_run, data_dir, tmp_path):
    # (evaluation does not change training losses)
    assert_stop_and_resume("sft", train_argv(data_dir, tmp_path, "--eval_strategy", "no"), tmp_path, 3, full_run[0])


def test_padded_lora_run(data_dir, tmp_path, capsys):
    """padding_free: false pads the batches (same collator); use_peft trains and saves a LoRA adapter only."""
    out = tmp_path / "out"
    assert main(train_argv(data_dir, out, "--max_steps", "2", "--padding_free", "false", "--eval_strategy", "no",
                           "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules",
                           "q_proj", "v_proj")) == 0
    stdout = capsys.readouterr().out
    assert "[trl-padfree] padding spent: " in stdout  # padded batches: the padding is paid, not avoided
    assert "packing probe" not in stdout  # nothing is packed, nothing to probe
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert all(0.0 < e["padding_share"] < 1.0 for e in log_history(out) if "loss" in e)
    assert "[trl-padfree] eval loss: " in stdout  # evaluated at the end when there is eval data (eval_strategy no)


def test_ctrl_c_asks_for_a_checkpoint_then_aborts_on_the_second():
    """SIGINT is handled like SIGTERM: first one -> save and stop at the step end; second one -> KeyboardInterrupt."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trl_padfree.launch.callbacks import GracefulStop

    messages: list[str] = []
    before = signal.getsignal(signal.SIGINT)
    stop = GracefulStop(announce=messages.append)
    args = TrainingArguments(output_dir="/nonexistent", use_cpu=True, report_to="none")
    state, control = TrainerState(), TrainerControl()
    with stop:
        state.global_step = 4
        stop.on_step_end(args, state, control)
        assert not control.should_save and not control.should_training_stop
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested == "SIGINT" and messages[0].startswith("SIGINT received: saving a checkpoint")
        stop.on_step_end(args, state, control)
        assert control.should_save and control.should_training_stop and stop.stopped_at == 4
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def test_auto_falls_back_when_the_model_cannot_load_with_padfree_and_explicit_padfree_names_the_fix(
        data_dir, tmp_path, capsys, demo_tokenizer):
    """GPT-Neo builds its attention from its own table, without "padfree" (KeyError at load): auto loads it with its
    default (eager), which the probe finds safe, and trains; padfree set explicitly is refused naming the fix."""
    model, out = save_tiny_model(tmp_path / "gpt_neo", "gpt_neo", GPT_NEO, demo_tokenizer), tmp_path / "out"
    argv = train_argv(data_dir, out, "--model_name_or_path", str(model), "--attn_implementation", "padfree")
    assert assert_refused_in_one_line("sft", argv, out) == (
        f"could not load model {str(model)!r}: its modeling code has no attention class "
        "for attn_implementation='padfree' (it keeps a table of its own); use 'sdpa' or 'eager' for this model")
    capsys.readouterr()
    assert main(train_argv(data_dir, out, "--model_name_or_path", str(model), "--max_steps", "2", "--eval_strategy",
                           "no")) == 0
    stdout = capsys.readouterr().out
    assert "[trl-padfree] attn_implementation auto: " in stdout and "cannot use 'padfree' (it fails to load" in stdout
    assert "[trl-padfree] packing probe: gpt_neo with 'eager' keeps packed examples apart" in stdout
    assert json.loads((out / "launch_summary.json").read_text())["attn_implementation"] == "eager"


def test_auto_falls_back_for_a_model_that_never_calls_padfree_and_the_probe_stops_it(data_dir, tmp_path, capsys,
                                                                                     demo_tokenizer):
    """MPT computes attention itself: auto falls back to its default (eager), which leaks; nothing is trained."""
    model, out = save_tiny_model(tmp_path / "mpt", "mpt", MPT, demo_tokenizer), tmp_path / "out"
    capsys.readouterr()
    assert main(train_argv(data_dir, out, "--model_name_or_path", str(model), "--max_steps", "2")) == 2
    captured = capsys.readouterr()
    assert "its attention code does not go through transformers' AttentionInterface" in captured.out
    assert captured.err.startswith("trl-padfree train: error: padding-free training is unsafe for this model: LEAKS: "
                                   "mpt (attn_implementation='eager'")
    assert captured.err.rstrip().endswith("no attn_implementation can keep packed examples apart; set "
                                          "padding_free=False.")
    assert not out.exists()
