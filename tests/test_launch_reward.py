"""``trl-padfree reward`` end to end on CPU: the demo config, bad input, the one-output classifier, margins, preview."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_runs import (
    assert_real_tokens_logged,
    assert_refused_in_one_line,
    demo_pairs_argv,
    demo_records,
    log_history,
    losses,
    run_command,
    run_launch,
    run_line,
    run_preview,
    write_jsonl,
)
from paths import CONFIGS, DEMO_MODEL
from transformers import TrainerCallback

CONFIG = CONFIGS / "demo-reward.yaml"
ROWS = demo_records("pref_train.jsonl", 16)


def reward_argv(out: Path, *extra: str) -> list[str]:
    return demo_pairs_argv(CONFIG, out, *extra)


def test_the_demo_config_trains_through_the_command(tmp_path):
    out = tmp_path / "out"
    proc = run_command("reward", reward_argv(out))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    stdout = proc.stdout
    for part in ("attn_implementation=padfree", "padding_free=True", "prompt_once=True"):
        assert part in run_line(stdout)
    assert "[trl-padfree] data: 32 training pairs, 8 eval pairs (format: prompt/chosen/rejected)" in stdout
    # transformers' load report names the new score head; its tensor-parallel check ("not sharded") does not run
    assert "score.weight | MISSING" in proc.stderr and "not sharded" not in proc.stderr, proc.stderr
    assert "keeps packed examples apart" in stdout  # the reward probe ran before anything was written
    assert "[trl-padfree] steps: 4/4 in " in stdout
    assert_real_tokens_logged(out, stdout)
    evals = [e for e in log_history(out) if "eval_accuracy" in e]
    assert [e["step"] for e in evals] == [0, 2, 4]  # eval_on_start, then every 2 steps
    assert (f"[trl-padfree] eval accuracy: {evals[0]['eval_accuracy']:.3f} -> {evals[-1]['eval_accuracy']:.3f}"
            f" (reward margin {evals[0]['eval_margin']:.3f} -> {evals[-1]['eval_margin']:.3f}; 3 evaluations)"
            ) in stdout.splitlines()
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["global_step"] == 4 and summary["saved_to"] == str(out) and summary["prompt_once"] is True
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}


@pytest.mark.parametrize(("records", "extra", "message"), [
    (None, ["--max_length", "4"], "train_file: all 32 training pairs would be dropped: TRL drops one whose chosen or "
     "rejected sequence has more than max_length=4 tokens (a reward is read at the end)"),
    ([{**r, "margin": 1.0 if i != 2 else "big"} for i, r in enumerate(ROWS)], [],
     "train_file record 2 (counting from 0): 'margin' must be a number"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, records, extra, message):
    if records:
        extra = ["--train_file", str(write_jsonl(tmp_path / "bad.jsonl", records))]
    assert_refused_in_one_line("reward", reward_argv(tmp_path / "out", *extra), tmp_path / "out", message)


class ScoreHeadSeen(TrainerCallback):
    def __init__(self) -> None:
        self.heads = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.heads.append((type(model).__name__, model.config.num_labels, model.score.weight.detach().clone()))


def test_margins_reach_the_loss_and_the_model_is_a_seeded_one_output_classifier(tmp_path):
    """A causal LM checkpoint gets a fresh score head, the same for the same seed (as TRL's RewardTrainer)."""
    first_losses, seen = {}, ScoreHeadSeen()
    for name, rows in (("plain", ROWS), ("margin", [{**r, "margin": 3.0} for r in ROWS])):
        out = tmp_path / name
        argv = reward_argv(out, "--train_file", str(write_jsonl(tmp_path / f"{name}.jsonl", rows)), "--max_steps", "1",
                           "--eval_strategy", "no", "--eval_on_start", "false", "--logging_steps", "1")
        code, stdout, stderr = run_launch(argv, "reward", [seen])
        assert code == 0, (stdout + stderr)[-2000:]
        assert ("with margins" in stdout) == (name == "margin")
        first_losses[name] = losses(out)[1]
    assert first_losses["margin"] > first_losses["plain"] + 1.0  # -logsigmoid(d - 3) against -logsigmoid(d), d near 0
    (kind, labels, head), (_, _, again) = seen.heads
    assert kind == "LlamaForSequenceClassification" and labels == 1 and head.shape == (1, head.shape[1])
    assert bool((head == again).all())


def test_preview_shows_the_pair_layout(demo_tokenizer):
    code, stdout, stderr = run_preview(["--config", str(CONFIG), "--model_name_or_path", str(DEMO_MODEL), "-n", "1",
                                        "--max_train_examples", "4"])
    assert code == 0, stderr
    dropped, *lines = stdout.splitlines()  # (the eval file's one pair over max_length, as the trainer would drop it)
    assert dropped == ("[trl-padfree] dropped 1 of 100 eval pairs whose chosen or rejected sequence has more than "
                       "max_length=512 tokens (a reward is read at the end; TRL drops them)")
    tok, first = demo_tokenizer, ROWS[0]
    chosen, rejected = (tok(first["prompt"] + first[side] + tok.eos_token)["input_ids"] for side in ("chosen", "rejected"))
    shared = next(i for i, (a, b) in enumerate(zip(chosen, rejected, strict=False)) if a != b)
    assert lines[0] == ("4 training pairs; each pair: the chosen and the rejected sequence, each scored at its last "
                        "token (padding_free=True, prompt_once=True)")
    assert lines[1] == (f"--- pair 0 (chosen {len(chosen)} tokens, rejected {len(rejected)}, common prefix {shared}; "
                        f"forwarded {len(chosen) + len(rejected) - shared + 1}) ---")
    assert lines[2].startswith("chosen:   " + first["prompt"].split("\n")[0]) and lines[3].endswith("[[<|eos|>]]")


def test_lora_trains_the_new_score_head_too(tmp_path):
    """use_peft: LoRA's task type is SEQ_CLS, so peft saves the fresh score head with the adapters."""
    out = tmp_path / "out"
    code, stdout, stderr = run_launch(reward_argv(out, "--max_steps", "1", "--eval_strategy", "no", "--eval_on_start",
                                                  "false", "--use_peft", "true", "--lora_target_modules", "q_proj",
                                                  "v_proj"), "reward")
    assert code == 0, (stdout + stderr)[-3000:]
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and "score" in adapter["modules_to_save"]
