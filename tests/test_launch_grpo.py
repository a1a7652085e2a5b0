"""``trl-padfree grpo`` / ``rloo`` end to end on CPU (32 demo prompts, 2 prompts x 4 completions of 8 tokens a
step), a recipe added to the launch at run time, and GRPO and DPO on two ranks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from launch_inputs import dpo_argv, write_preference_data
from launch_runs import (
    assert_real_tokens_logged,
    assert_refused_in_one_line,
    assert_stop_and_resume,
    log_history,
    run_command,
    run_launch,
    run_line,
    run_preview,
    write_jsonl,
    write_short_demo_records,
)
from paths import CONFIGS, DEMO_MODEL

STEPS = 4


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 short prompts (with their answers, ``chosen``) of the demo's preference data."""
    return write_short_demo_records(tmp_path_factory.mktemp("grpo-data") / "prompts.jsonl", "pref_train.jsonl", 32,
                                    shorter_than=300)


def grpo_argv(prompts: Path, out: Path, *extra: str) -> list[str]:
    return ["--config", str(CONFIGS / "demo-grpo.yaml"), "--model_name_or_path", str(DEMO_MODEL), "--train_file",
            str(prompts), "--output_dir", str(out), "--max_steps", str(STEPS), "--per_device_train_batch_size", "8",
            "--num_generations", "4", "--max_completion_length", "8", "--logging_steps", "1", *extra]


def steps(out: Path) -> dict[int, dict]:
    return {e["step"]: e for e in log_history(out) if "reward" in e}


@pytest.fixture(scope="module")
def full_run(prompts: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    out = tmp_path_factory.mktemp("grpo-full") / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, stdout, stderr = run_launch(grpo_argv(prompts, out), "grpo")
    assert code == 0, (stdout + stderr)[-3000:]
    return out, stdout, [str(w.message) for w in caught]


def test_demo_config_trains_probes_and_summarises(full_run):
    out, stdout, warned = full_run
    assert (out / "model.safetensors").is_file()
    for part in ("attn_implementation=padfree", "padding_free=True", "prompt_once=True", "reward_funcs=answer_chars"):
        assert part in run_line(stdout)
    assert not [w for w in warned if "is_gradient_checkpointing" in w]  # TRL's use of a deprecated name, hidden
    assert "[trl-padfree] data: 32 training prompts (format: prompt)" in stdout
    assert "keeps packed examples apart" in stdout  # the group probe ran before anything was written
    assert f"[trl-padfree] steps: {STEPS}/{STEPS} in " in stdout
    assert_real_tokens_logged(out, stdout, generation=True)
    logged = steps(out)
    assert sorted(logged) == list(range(1, STEPS + 1))
    assert (f"[trl-padfree] mean reward: {logged[1]['reward']:.3f} -> {logged[STEPS]['reward']:.3f} ({STEPS} logged "
            "steps)") in stdout.splitlines()
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["global_step"] == STEPS and summary["saved_to"] == str(out)
    assert summary["prompt_once"] is True and summary["reward_funcs"] == ["answer_chars"]


def test_sigterm_saves_a_checkpoint_and_resume_reproduces_the_run(full_run, prompts, tmp_path):
    # the same completions sampled, rewarded and trained on after the resume
    assert_stop_and_resume("grpo", grpo_argv(prompts, tmp_path), tmp_path, 2, full_run[0],
                           ("loss", "reward", "reward_std", "entropy", "completions/mean_length"))


def test_input_the_rewards_cannot_score_is_refused(tmp_path, prompts):
    no_rewards = tmp_path / "no-rewards.yaml"
    no_rewards.write_text("".join(line for line in (CONFIGS / "demo-grpo.yaml").read_text().splitlines(True)
                                  if not line.startswith("reward_funcs")))
    for config, record, message in [
        (None, {"question": "hi", "answer": "there"}, "train_file: RL records need a 'prompt'"),
        # the demo's rewards read the known answer: records with a prompt only fail at validation, not at step 1
        (None, {"prompt": "### Question: Count to three.\n### Answer:"}, "reward_funcs answer_chars score a "
         "completion against its known answer ... no 'answer' or 'chosen' column (columns: prompt)"),
        (no_rewards, None, "reward_funcs is empty: name at least one reward"),
    ]:
        argv = grpo_argv(prompts, tmp_path / "out", *(["--train_file", str(write_jsonl(tmp_path / "bad.jsonl",
                                                                                       [record]))] if record else []))
        argv[1] = str(config or argv[1])
        line = assert_refused_in_one_line("grpo", argv, tmp_path / "out")
        assert all(part in line for part in message.split(" ... ")), line


def test_rloo_trains_with_a_reward_given_by_import_path(prompts, tmp_path, monkeypatch):
    module = tmp_path / "my_rewards.py"
    module.write_text("def short(completions, **kwargs):\n    return [-len(c) / 100 for c in completions]\n")
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)  # as trl grpo: a reward module beside the config, imported from the working directory
    code, stdout, stderr = run_launch(grpo_argv(prompts, out, "--reward_funcs", "my_rewards:short", "--max_steps",
                                                "2"), "rloo")
    assert code == 0, (stdout + stderr)[-3000:]
    assert "reward_funcs=my_rewards:short" in stdout and "[trl-padfree] steps: 2/2" in stdout
    assert all("rewards/short/mean" in e for e in steps(out).values())
    assert_real_tokens_logged(out, stdout, generation=True)  # RLOO's generation is timed as GRPO's


def test_a_recipe_added_at_run_time_reaches_every_step(tmp_path, monkeypatch):
    """One module and one line in ``tasks.COMMANDS`` make a new trainer of the launch (here: SFT's recipe with a
    line of its own)."""
    import sys
    import types

    from trl_padfree.launch import tasks
    from trl_padfree.launch.console import say
    from trl_padfree.launch.tasks import sft

    def run_toy(cfg, callbacks=()):
        summary = sft.run(cfg, callbacks)
        say(f"toy recipe: {summary['global_step']} steps")
        return summary

    toy = types.ModuleType("trl_padfree.launch.tasks.toy")
    toy.__dict__.update({k: v for k, v in vars(sft).items() if not k.startswith("__")}, run=run_toy)
    monkeypatch.setitem(tasks.COMMANDS, "toy", "toy")  # both are gone after the test
    monkeypatch.setitem(sys.modules, toy.__name__, toy)
    assert tasks.prog("toy") == "trl-padfree toy" and tasks.get_task("toy") is toy
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"Q{i}?", "completion": f" A{i}"} for i in range(8)])
    argv = ["--model_name_or_path", str(DEMO_MODEL), "--train_file", str(data), "--output_dir",
            str(tmp_path / "out"), "--max_steps", "2", "--per_device_train_batch_size", "4", "--use_cpu", "true",
            "--report_to", "none", "--save_strategy", "no", "--torch_num_threads", "1"]
    code, stdout, stderr = run_launch(argv, "toy")
    assert code == 0, (stdout + stderr)[-3000:]
    assert "[trl-padfree] toy recipe: 2 steps" in stdout and "[trl-padfree] steps: 2/2" in stdout
    code, _, stderr = run_launch([*argv, "--no_such_field", "1"], "toy")
    assert code == 2 and stderr.startswith("trl-padfree toy: error: unknown option '--no_such_field'")


def test_preview_shows_a_groups_layout_and_counts_a_chat_prompts_tokens(prompts, demo_tokenizer, tmp_path):
    def preview(train_file: Path) -> list[str]:
        code, stdout, stderr = run_preview(["--config", str(CONFIGS / "demo-grpo.yaml"), "--train_file",
                                            str(train_file), "--model_name_or_path", str(DEMO_MODEL),
                                            "--max_completion_length", "8", "-n", "1"])
        assert code == 0, stderr
        return stdout.splitlines()

    records = [json.loads(line) for line in prompts.read_text(encoding="utf-8").splitlines()[:2]]
    first = records[0]["prompt"]
    p = len(demo_tokenizer(first, add_special_tokens=False)["input_ids"])
    assert preview(prompts) == [
        "32 training prompts; each group: 1 prompt, 4 completions of up to 8 tokens (padding_free=True, "
        "prompt_once=True)",
        f"--- prompt 0 ({p} tokens): {first!r}",
        "    shared: the prompt, forwarded once for the group; not scored",
        "    scored: each completion's tokens (4 x up to 8), attending to the prompt and to itself only",
        f"    forwarded tokens at most: {p + 4 * 8} (padded TRL layout: {4 * (p + 8)})",
    ]
    # a chat prompt counts its tokens as TRL's GRPOTrainer tokenizes it (transformers 5's apply_chat_template
    # returns a BatchEncoding, whose length is its number of keys, not the prompt's tokens)
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": r["prompt"]}],
                                                  "chosen": r["chosen"]} for r in records])
    p = len(demo_tokenizer.apply_chat_template([{"role": "user", "content": first}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"])
    assert p > 10
    lines = preview(chat)
    assert lines[1] == f"--- prompt 0 ({p} tokens): {first!r}"
    assert lines[4] == f"    forwarded tokens at most: {p + 4 * 8} (padded TRL layout: {4 * (p + 8)})"


@pytest.mark.slow
@pytest.mark.parametrize("task", ["grpo", "dpo"])
def test_two_ranks_train_and_exit(task, prompts, tmp_path):
    out = tmp_path / "out"
    argv = (grpo_argv(prompts, out) if task == "grpo" else
            dpo_argv(write_preference_data(tmp_path), out, "--eval_strategy", "no"))
    proc = run_command(task, [*argv, "--max_steps", "2"], ranks=2, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
    assert proc.stdout.count("[trl-padfree] steps: 2/2") == 1 and proc.stdout.count("[trl-padfree] run: ") == 1
    if task == "dpo":  # both ranks took a batch of 4 of the 48 pairs per step
        assert json.loads((out / "trainer_state.json").read_text())["epoch"] == pytest.approx(2 * 2 * 4 / 48)
