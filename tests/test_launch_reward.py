"""``trl-padfree reward`` end to end on CPU: the demo config through the real command (a few steps), bad input exits 2
with one line and nothing written, the model is a one-output sequence classifier, the preview shows the pair
layout, and ``make demo-reward`` is the command the README shows. Runs on the whole supported window (trl >= 1.8)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from paths import CONFIGS, DEMO, DEMO_MODEL, ROOT
from transformers import TrainerCallback

from trl_padfree.launch import main

CONFIG = CONFIGS / "demo-reward.yaml"
PREFIX = "trl-padfree reward: error: "


def reward_argv(out: Path, *extra: str) -> list[str]:
    return [
        "--config", str(CONFIG),
        "--model_name_or_path", str(DEMO_MODEL),
        "--train_file", str(DEMO / "data" / "pref_train.jsonl"),
        "--eval_file", str(DEMO / "data" / "pref_eval.jsonl"),
        "--output_dir", str(out),
        "--max_steps", "4", "--max_train_examples", "32", "--max_eval_examples", "8",
        "--logging_steps", "2", "--eval_steps", "2",
        *extra,
    ]  # fmt: skip


def run(argv: list[str], callbacks=()) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv, callbacks, task="reward")
    return code, out.getvalue(), err.getvalue()


def test_the_demo_config_trains_through_the_command(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "trl_padfree.cli", "reward", *reward_argv(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    stdout = proc.stdout
    run_line = next(line for line in stdout.splitlines() if line.startswith("[trl-padfree] run: "))
    for part in ("attn_implementation=padfree", "padding_free=True", "prompt_once=True"):
        assert part in run_line, run_line
    assert "[trl-padfree] data: 32 training pairs, 8 eval pairs (format: prompt/chosen/rejected)" in stdout
    assert ("[trl-padfree] reward model: LlamaForSequenceClassification from a LlamaForCausalLM checkpoint, with a new "
            "score head (drawn from the config's seed)") in stdout and "MISSING" not in stdout + proc.stderr
    assert "keeps packed examples apart" in stdout  # the reward probe ran before anything was written
    assert "[trl-padfree] steps: 4/4 in " in stdout and "real tokens/s" not in stdout
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    evals = [e for e in history if "eval_accuracy" in e]
    assert [e["step"] for e in evals] == [0, 2, 4]  # eval_on_start, then every 2 steps
    line = next(line for line in stdout.splitlines() if line.startswith("[trl-padfree] eval accuracy: "))
    assert line == (f"[trl-padfree] eval accuracy: {evals[0]['eval_accuracy']:.3f} -> {evals[-1]['eval_accuracy']:.3f}"
                    f" (reward margin {evals[0]['eval_margin']:.3f} -> {evals[-1]['eval_margin']:.3f}; 3 evaluations)")
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["global_step"] == 4 and summary["saved_to"] == str(out) and summary["prompt_once"] is True
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}


class ModelSeen(TrainerCallback):
    def __init__(self) -> None:
        self.models = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.models.append(model)


def test_the_model_is_a_seeded_one_output_classifier(tmp_path):
    """A causal LM checkpoint gets a fresh score head, the same for the same seed (as TRL's RewardTrainer seeds)."""
    heads = []
    for name in ("a", "b"):
        seen = ModelSeen()
        code, stdout, stderr = run(reward_argv(tmp_path / name, "--max_steps", "1", "--eval_strategy", "no",
                                               "--eval_on_start", "false", "--learning_rate", "0"), [seen])
        assert code == 0, (stdout + stderr)[-3000:]
        (model,) = seen.models
        assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.num_labels == 1
        heads.append(model.score.weight.detach().clone())
    assert heads[0].shape == (1, heads[0].shape[1]) and bool((heads[0] == heads[1]).all())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--learning_rat", "1e-3"), "unknown option '--learning_rat' on the command line; did you mean "
                                     "'learning_rate'?"),
        (("--response_template", "### Answer:"), "response_template is a setting of trl-padfree train (SFT); "
                                                 "trl-padfree reward trains on prompt/chosen/rejected records"),
        (("--scored_lm_head", "false"), "scored_lm_head does not apply to trl-padfree reward"),
        (("--attn_implementation", "sdpa"), "prompt_once: true needs attn_implementation 'padfree'"),
        (("--padding_free", "false"), "prompt_once: true needs padding_free: true"),
        (("--center_rewards_coefficient", "-1"), "center_rewards_coefficient must be at least 0"),
        (("--max_length", "4"), "train_file: all 32 pairs would be dropped: TRL's RewardTrainer drops a pair whose "
                                "chosen or rejected sequence has more than max_length=4 tokens"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, extra, message):
    out = tmp_path / "out"
    code, stdout, stderr = run(reward_argv(out, *extra))
    assert code == 2, stdout + stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(PREFIX) and message in lines[0], stderr
    assert not out.exists()  # nothing written


def test_a_typo_in_the_config_file_names_the_key(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text(CONFIG.read_text(encoding="utf-8").replace("center_rewards_coefficient:",
                                                                 "center_reward_coefficient:"), encoding="utf-8")
    argv = reward_argv(tmp_path / "out")
    argv[1] = str(config)
    code, _, stderr = run(argv)
    assert code == 2 and not (tmp_path / "out").exists()
    assert stderr.strip() == (f"{PREFIX}unknown key 'center_reward_coefficient' in {config}; did you mean "
                              "'center_rewards_coefficient'?")


def test_bad_records_are_named(tmp_path):
    rows = [json.loads(line) for line in (DEMO / "data" / "pref_train.jsonl").read_text().splitlines()[:6]]
    for name, records, message in [
        ("no-chosen", [*rows[:3], {"prompt": rows[3]["prompt"], "rejected": rows[3]["rejected"]}, *rows[4:]],
         "train_file record 3 (counting from 0): 'chosen' must be a string or a list of chat messages"),
        ("bad-margin", [{**r, "margin": 1.0 if i != 2 else "big"} for i, r in enumerate(rows)],
         "train_file record 2 (counting from 0): 'margin' must be a number"),
    ]:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        code, _, stderr = run(reward_argv(tmp_path / "out", "--train_file", str(path)))
        assert code == 2 and not (tmp_path / "out").exists(), stderr
        assert stderr.startswith(PREFIX) and message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_margins_reach_the_loss(tmp_path):
    rows = [json.loads(line) for line in (DEMO / "data" / "pref_train.jsonl").read_text().splitlines()[:16]]
    path = tmp_path / "margins.jsonl"
    path.write_text("".join(json.dumps({**r, "margin": 3.0}) + "\n" for r in rows), encoding="utf-8")
    losses = {}
    for name, train in (("plain", tmp_path / "plain.jsonl"), ("margin", path)):
        if name == "plain":
            train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        out = tmp_path / name
        code, stdout, stderr = run(reward_argv(out, "--train_file", str(train), "--max_steps", "1", "--eval_strategy",
                                               "no", "--eval_on_start", "false", "--logging_steps", "1"))
        assert code == 0, (stdout + stderr)[-2000:]
        assert ("with margins" in stdout) == (name == "margin")
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        losses[name] = next(e["loss"] for e in history if "loss" in e)
    assert losses["margin"] > losses["plain"] + 1.0  # -logsigmoid(d - 3) against -logsigmoid(d), d near 0


def test_preview_shows_the_pair_layout(demo_tokenizer):
    from trl_padfree.launch.preview import main as preview_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = preview_main(["--config", str(CONFIG), "--model_name_or_path", str(DEMO_MODEL), "-n", "1",
                             "--max_train_examples", "4"])
    assert code == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    tok = demo_tokenizer
    first = json.loads((DEMO / "data" / "pref_train.jsonl").read_text().splitlines()[0])
    chosen = tok(first["prompt"] + first["chosen"] + tok.eos_token)["input_ids"]
    rejected = tok(first["prompt"] + first["rejected"] + tok.eos_token)["input_ids"]
    shared = next(i for i, (a, b) in enumerate(zip(chosen, rejected, strict=False)) if a != b)
    assert lines[0] == ("4 training pairs; each pair: the chosen and the rejected sequence, each scored at its last "
                        "token (padding_free=True, prompt_once=True)")
    assert lines[1] == (f"--- pair 0 (chosen {len(chosen)} tokens, rejected {len(rejected)}, common prefix {shared}; "
                        f"forwarded {len(chosen) + len(rejected) - shared + 1}) ---")
    assert lines[2].startswith("chosen:   " + first["prompt"].split("\n")[0]) and lines[3].endswith("[[<|eos|>]]")


def test_every_numeric_field_has_a_range_or_a_reason():
    from trl_padfree.launch.tasks import get_task
    from trl_padfree.launch.validate import NUMERIC_RANGES, UNCHECKED_NUMERIC

    task = get_task("reward")
    numeric = set()
    for cls in task.argument_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            if any(a in (int, float) for a in args) and bool not in args:
                numeric.add(f.name)
    assert numeric - set(NUMERIC_RANGES) - set(UNCHECKED_NUMERIC) - set(task.numeric_ranges()) == set()


def test_make_demo_reward_runs_the_command_the_readme_shows():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^demo-reward: install\n\t(.+)$", makefile, re.M)
    assert recipe and recipe.group(1) == "$(VENV)/bin/trl-padfree reward --config configs/demo-reward.yaml"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`make demo-reward`" in readme
    assert re.search(r"^trl-padfree reward --config configs/demo-reward\.yaml +# ", readme, re.M)  # shown in the README's command block (run by test_docs)


def test_lora_trains_the_new_score_head_too(tmp_path):
    """With use_peft the LoRA task type is SEQ_CLS (unless set): peft then saves the fresh score head with the adapters."""
    out = tmp_path / "out"
    code, stdout, stderr = run(reward_argv(out, "--max_steps", "1", "--eval_strategy", "no", "--eval_on_start", "false",
                                           "--use_peft", "true", "--lora_target_modules", "q_proj", "v_proj"))
    assert code == 0, (stdout + stderr)[-3000:]
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and "score" in adapter["modules_to_save"]
