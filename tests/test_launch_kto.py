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
    run_preview,
    write_jsonl,
)
from paths import CONFIGS, DEMO_MODEL

CONFIG = CONFIGS / "demo-kto.yaml"
PREFIX = "trl-padfree kto: error: "


def kto_argv(out: Path, *extra: str) -> list[str]:
    return demo_pairs_argv(CONFIG, out, "--per_device_train_batch_size", "4", *extra)


def quick(out: Path, *extra: str) -> list[str]:
    return kto_argv(out, "--max_steps", "1", "--max_train_examples", "8", "--eval_strategy", "no", "--eval_on_start",
                    "false", *extra)


def test_the_demo_config_trains_through_the_command(tmp_path):
    out = tmp_path / "out"
    proc = run_command("kto", kto_argv(out))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    stdout = proc.stdout
    run_line = next(line for line in stdout.splitlines() if line.startswith("[trl-padfree] run: "))
    for part in ("attn_implementation=padfree", "padding_free=True", "prompt_once=True", "loss_type=kto",
                 "scored_lm_head=True"):
        assert part in run_line, run_line
    assert ("[trl-padfree] data: 32 training pairs, 8 eval pairs (format: text, prompt/chosen/rejected pairs; training "
            "examples: 32 desirable, 32 undesirable, each pair unpaired by TRL)") in stdout
    assert "keeps packed examples apart" in stdout and "[trl-padfree] reference model: a second copy" in stdout
    assert "[trl-padfree] steps: 4/4 in " in stdout
    assert_real_tokens_logged(out, stdout)
    evals = [e for e in log_history(out) if "eval_rewards/chosen" in e]
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert evals[0]["eval_rewards/chosen"] == 0.0 and evals[0]["eval_rewards/rejected"] == 0.0  # policy = reference

    def pair(key: str) -> str:
        return f"{evals[0][key]:.3f} -> {evals[-1][key]:.3f}"

    line = next(line for line in stdout.splitlines() if line.startswith("[trl-padfree] eval rewards: "))
    assert line == (f"[trl-padfree] eval rewards: desirable {pair('eval_rewards/chosen')}, undesirable "
                    f"{pair('eval_rewards/rejected')} (margin {pair('eval_rewards/margins')}, KL {pair('eval_kl')}; "
                    "3 evaluations)")
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]  # KTO's loss falls
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["global_step"] == 4 and summary["saved_to"] == str(out)
    assert summary["prompt_once"] is True and summary["scored_lm_head"] is True


def test_unpaired_records_train_and_an_evaluation_without_a_margin_prints_no_nan(tmp_path):
    # eval records of one kind only: TRL logs no eval_rewards/margins (nor rewards/rejected); the summary leaves
    # them out instead of printing "margin nan -> nan"
    records = demo_records("pref_train.jsonl", 8)
    train = write_jsonl(tmp_path / "train.jsonl", [
        {"prompt": r["prompt"], "completion": r["chosen" if i % 3 else "rejected"], "label": bool(i % 3)}
        for i, r in enumerate(records)])
    evals = write_jsonl(tmp_path / "eval.jsonl", [
        {"prompt": r["prompt"], "completion": r["chosen"], "label": True} for r in records[:4]])
    code, stdout, stderr = run_launch(kto_argv(tmp_path / "out", "--max_steps", "1", "--train_file", str(train),
                                               "--eval_file", str(evals), "--eval_strategy", "no", "--eval_on_start",
                                               "true"), "kto")
    assert code == 0, (stdout + stderr)[-3000:]
    assert ("[trl-padfree] data: 8 training examples, 4 eval examples (format: text, prompt/completion/label; training "
            "examples: 5 desirable, 3 undesirable)") in stdout
    assert "[trl-padfree] steps: 1/1 in " in stdout
    history = [e for e in log_history(tmp_path / "out") if "eval_rewards/chosen" in e]
    assert len(history) == 2 and not any("eval_rewards/margins" in e for e in history)
    line = next(line for line in stdout.splitlines() if line.startswith("[trl-padfree] eval rewards: "))
    first, last = history[0], history[-1]
    assert line == (f"[trl-padfree] eval rewards: desirable {first['eval_rewards/chosen']:.3f} -> "
                    f"{last['eval_rewards/chosen']:.3f} (KL {first['eval_kl']:.3f} -> {last['eval_kl']:.3f}; 2 evaluations)")


def test_bad_records_are_named(tmp_path):
    rows = demo_records("pref_train.jsonl", 6)
    unpaired = [{"prompt": r["prompt"], "completion": r["chosen"], "label": True} for r in rows]
    for records, message in [
        ([*rows[:3], {"prompt": rows[3]["prompt"], "rejected": rows[3]["rejected"]}, *rows[4:]],
         "train_file record 3 (counting from 0): 'chosen' must be a string or a list of chat messages"),
        ([*unpaired[:2], {**unpaired[2], "label": "yes"}, *unpaired[3:]],
         "train_file record 2 (counting from 0): 'label' must be true (desirable) or false (undesirable), got 'yes'"),
        ([{"prompt": r["prompt"], "completion": r["chosen"]} for r in rows],
         "train_file: KTO records need 'prompt', 'completion' and 'label' (true: desirable), or preference pairs "
         "'prompt', 'chosen', 'rejected'; missing 'label' (columns: prompt, completion)"),
    ]:
        path = write_jsonl(tmp_path / "bad.jsonl", records)
        assert_refused_in_one_line("kto", quick(tmp_path / "out", "--train_file", str(path)), tmp_path / "out", message)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--max_length", "8"), "train_file: all 32 training pairs would be dropped"),
        (("--per_device_train_batch_size", "1"), "KTOTrainer"),  # TRL's own check, as one line
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, extra, message):
    assert_refused_in_one_line("kto", kto_argv(tmp_path / "out", *extra), tmp_path / "out", message)


def test_preview_shows_the_examples():
    code, stdout, stderr = run_preview(["--config", str(CONFIG), "--model_name_or_path", str(DEMO_MODEL), "-n", "2",
                                        "--max_train_examples", "4"])
    assert code == 0, stderr
    lines = stdout.splitlines()
    (first,) = demo_records("pref_train.jsonl", 1)
    assert lines[0].startswith("8 training examples (format: text, prompt/chosen/rejected pairs)")
    assert lines[1].startswith("--- example 0 (desirable; prompt ")
    assert lines[2:4] == [first["prompt"].split("\n")[0], "### Answer:[[" + first["chosen"] + "<|eos|>]]"]
    assert lines[-1] == "examples dropped before training (prompt alone fills max_length=512): 0 of 8"


def test_preview_of_a_kto_config_without_kto_only_keys_takes_task(tmp_path):
    """A KTO config that sets no KTO-only key reads as DPO's (the first registered of the trainers with its fields):
    the refusal then says how the preview told the trainer and to give ``--task``; with ``--task kto`` it previews."""
    rows = demo_records("pref_train.jsonl", 4)
    data = write_jsonl(tmp_path / "unpaired.jsonl", [{"prompt": r["prompt"], "completion": r["chosen"], "label": True}
                                                for r in rows])
    config = tmp_path / "kto.yaml"
    config.write_text(f"model_name_or_path: {DEMO_MODEL}\ntrain_file: {data}\nprompt_once: true\n")

    def preview(*extra: str) -> tuple[int, str, str]:
        return run_preview(["--config", str(config), "-n", "1", *extra])

    code, _, err = preview()
    assert code == 2 and err.strip().endswith(
        "(previewed as a config of trl-padfree dpo, told from its fields; for another trainer's config add --task, "
        "e.g. --task kto)"), err
    code, out, err = preview("--task", "kto")
    assert code == 0, err
    assert out.startswith("4 training examples (format: text, prompt/completion/label)"), out
    code, _, err = preview("--task", "ktoo")
    assert code == 2 and "--task must be one of sft, dpo, grpo, rloo, reward, kto" in err, err


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
