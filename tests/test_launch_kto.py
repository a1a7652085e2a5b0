"""``trl-padfree kto`` end to end on CPU (on the DPO demo's pairs, which TRL unpairs, or unpaired records), its bad
input, preview and evaluation logits."""

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
    run_command,
    run_launch,
    run_line,
    run_preview,
    write_jsonl,
)
from paths import CONFIGS, DEMO_MODEL

CONFIG = CONFIGS / "demo-kto.yaml"
ROWS = demo_records("pref_train.jsonl", 8)
UNPAIRED = [{"prompt": r["prompt"], "completion": r["chosen"], "label": True} for r in ROWS]


def kto_argv(out: Path, *extra: str) -> list[str]:
    return demo_pairs_argv(CONFIG, out, "--per_device_train_batch_size", "4", *extra)


def shown(history: list[dict], key: str) -> str:
    return f"{history[0][key]:.3f} -> {history[-1][key]:.3f}"


def test_the_demo_config_trains_through_the_command(tmp_path):
    out = tmp_path / "out"
    proc = run_command("kto", kto_argv(out))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    stdout = proc.stdout
    for part in ("attn_implementation=padfree", "padding_free=True", "prompt_once=True", "loss_type=kto",
                 "scored_lm_head=True"):
        assert part in run_line(stdout)
    assert ("[trl-padfree] data: 32 training pairs, 8 eval pairs (format: text, prompt/chosen/rejected pairs; training "
            "examples: 32 desirable, 32 undesirable, each pair unpaired by TRL)") in stdout
    assert "keeps packed examples apart" in stdout and "[trl-padfree] reference model: a second copy" in stdout
    assert "[trl-padfree] steps: 4/4 in " in stdout
    assert_real_tokens_logged(out, stdout)
    evals = [e for e in log_history(out) if "eval_rewards/chosen" in e]
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert evals[0]["eval_rewards/chosen"] == 0.0 and evals[0]["eval_rewards/rejected"] == 0.0  # policy = reference
    assert (f"[trl-padfree] eval rewards: desirable {shown(evals, 'eval_rewards/chosen')}, undesirable "
            f"{shown(evals, 'eval_rewards/rejected')} (margin {shown(evals, 'eval_rewards/margins')}, KL "
            f"{shown(evals, 'eval_kl')}; 3 evaluations)") in stdout.splitlines()
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]  # KTO's loss falls
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["global_step"] == 4 and summary["saved_to"] == str(out)
    assert summary["prompt_once"] is True and summary["scored_lm_head"] is True


def test_unpaired_records_train_and_an_evaluation_without_a_margin_prints_no_nan(tmp_path):
    # eval records of one kind only: TRL logs no eval_rewards/margins; the summary leaves it out (no "margin nan")
    train = write_jsonl(tmp_path / "train.jsonl", [{**r, "label": bool(i % 3)} for i, r in enumerate(UNPAIRED)])
    evals = write_jsonl(tmp_path / "eval.jsonl", UNPAIRED[:4])
    code, stdout, stderr = run_launch(kto_argv(tmp_path / "out", "--max_steps", "1", "--train_file", str(train),
                                               "--eval_file", str(evals), "--eval_strategy", "no", "--eval_on_start",
                                               "true"), "kto")
    assert code == 0, (stdout + stderr)[-3000:]
    assert ("[trl-padfree] data: 8 training examples, 4 eval examples (format: text, prompt/completion/label; training "
            "examples: 5 desirable, 3 undesirable)") in stdout and "[trl-padfree] steps: 1/1 in " in stdout
    history = [e for e in log_history(tmp_path / "out") if "eval_rewards/chosen" in e]
    assert len(history) == 2 and not any("eval_rewards/margins" in e for e in history)
    assert (f"[trl-padfree] eval rewards: desirable {shown(history, 'eval_rewards/chosen')} (KL "
            f"{shown(history, 'eval_kl')}; 2 evaluations)") in stdout.splitlines()


# (pairs go through dpo's record checks, tests/test_launch_dpo_errors.py)
@pytest.mark.parametrize(("records", "extra", "message"), [
    ([*UNPAIRED[:2], {**UNPAIRED[2], "label": "yes"}, *UNPAIRED[3:]], [],
     "train_file record 2 (counting from 0): 'label' must be true (desirable) or false (undesirable), got 'yes'"),
    ([{"prompt": r["prompt"], "completion": r["chosen"]} for r in ROWS], [],
     "train_file: KTO records need 'prompt', 'completion' and 'label' (true: desirable), or preference pairs "
     "'prompt', 'chosen', 'rejected'; missing 'label' (columns: prompt, completion)"),
    (None, ["--max_length", "8"], "train_file: all 32 training pairs would be dropped"),
    (None, ["--per_device_train_batch_size", "1"], "KTOTrainer"),  # TRL's own refusal, as one line
])
def test_bad_input_exits_2_with_one_line(tmp_path, records, extra, message):
    if records:
        extra = ["--train_file", str(write_jsonl(tmp_path / "bad.jsonl", records))]
    assert_refused_in_one_line("kto", kto_argv(tmp_path / "out", "--max_steps", "1", *extra), tmp_path / "out",
                               message)


def test_preview_shows_the_examples():
    code, stdout, stderr = run_preview(["--config", str(CONFIG), "--model_name_or_path", str(DEMO_MODEL), "-n", "2",
                                        "--max_train_examples", "4"])
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("8 training examples (format: text, prompt/chosen/rejected pairs)")
    assert lines[1].startswith("--- example 0 (desirable; prompt ")
    assert lines[2:4] == [ROWS[0]["prompt"].split("\n")[0], "### Answer:[[" + ROWS[0]["chosen"] + "<|eos|>]]"]
    assert lines[-1] == "examples dropped before training (prompt alone fills max_length=512): 0 of 8"


def test_preview_of_a_config_several_trainers_take_says_which_it_chose(tmp_path):
    """A KTO config that sets no KTO-only key reads as DPO's (the first of the trainers with its fields): preview
    says so and that ``--task`` picks another; with ``--task kto`` it previews KTO's examples."""
    data = write_jsonl(tmp_path / "unpaired.jsonl", UNPAIRED[:4])
    config = tmp_path / "kto.yaml"
    config.write_text(f"model_name_or_path: {DEMO_MODEL}\ntrain_file: {data}\nprompt_once: true\n")
    code, _, err = run_preview(["--config", str(config), "-n", "1"])
    assert code == 2 and err.startswith(
        "trl-padfree preview: note: previewed as a config of trl-padfree dpo (its fields fit grpo, rloo, reward, kto "
        "too; --task <name> picks another)\n"), err
    code, out, err = run_preview(["--config", str(config), "-n", "1", "--task", "kto"])
    assert code == 0 and err == "" and out.startswith("4 training examples (format: text, prompt/completion/label)")
    code, _, err = run_preview(["--config", str(config), "--task", "ktoo"])
    assert code == 2 and "argument --task: invalid choice: 'ktoo' (choose from 'sft', 'dpo'," in err, err


def test_evaluation_logits_are_one_row_per_example_as_trls(tmp_path):
    """``prediction_loss_only=False``: ``compute_metrics`` gets TRL's padded shapes and values (issue 24)."""
    import numpy as np
    import tiny_kto as T

    from trl_padfree import KTOTrainer

    tok, data, eval_data = T.tokenizer(), T.examples(8), T.examples(10, seed=1)
    seen = {}
    for layout in ("padded", "padfree"):
        def metrics(prediction, layout=layout):
            seen[layout] = (prediction.predictions, prediction.label_ids)
            return {}

        trainer = KTOTrainer(T.model(layout), T.model(layout, seed=1), processing_class=tok, train_dataset=data,
                             eval_dataset=eval_data, compute_metrics=metrics,
                             args=T.config(layout, str(tmp_path / layout), per_device_eval_batch_size=4,
                                           prediction_loss_only=False))
        trainer.evaluate()
    (want, want_ids), (got, got_ids) = seen["padded"], seen["padfree"]
    assert got.shape == want.shape and got.shape[0] == len(eval_data)
    assert (got_ids == want_ids).all()
    real = got[..., 0] != -100
    assert all(row[: row.sum()].all() for row in real)  # each row: its sequence, then padding
    assert np.abs(got[real] - want[real]).max() < 1e-4
