"""What a new user hit from a fresh clone (issue 25, item 3): each fixed, each tested as the user runs it (the
``trl-padfree`` command in its own process, from a directory outside the checkout where that matters).
"""

from __future__ import annotations

import json
import logging

import pytest
from launch_runs import run_command
from paths import DEMO, ROOT

from trl_padfree import cli
from trl_padfree.launch import load_config, main
from trl_padfree.launch.model import load_tokenizer

INDEXING_WARNING = "Token indices sequence length is longer than the specified maximum"


def test_no_sub_command_exits_2_with_the_usage(capsys):
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("trl-padfree: a sub-command is needed.\n\nusage: trl-padfree {train,dpo,")
    assert cli.main(["--help"]) == 0 and capsys.readouterr().out.startswith("usage: trl-padfree {")
    assert cli.main(["trian"]) == 2 and capsys.readouterr().err.startswith("trl-padfree: unknown sub-command 'trian'.")


def test_preview_takes_the_built_in_config_names_and_prints_no_indexing_warning(tmp_path, monkeypatch, capfd):
    """From a directory outside the checkout, as an installed package runs it (capfd: transformers' logging too)."""
    monkeypatch.chdir(tmp_path)
    for name in ["demo", "demo-chat", "demo-dpo"]:
        assert cli.main(["preview", "--config", name, "-n", "1"]) == 0, name
        out, err = capfd.readouterr()
        assert "--- " in out and INDEXING_WARNING not in out + err, (name, err[-2000:])


@pytest.mark.parametrize("config", ["demo", "demo-dpo"])
def test_the_launch_tokenizer_does_not_warn_about_indexing_errors_where_max_length_cuts(config, monkeypatch):
    """The launch cuts every sequence to ``max_length``, so its tokenizer does not warn of indexing errors for a text
    longer than ``model_max_length``; without ``max_length`` the warning is true and stays."""
    logger, records = logging.getLogger("transformers.tokenization_utils_base"), []
    monkeypatch.setattr(logger, "warning", lambda message, *args, **kwargs: records.append(message))
    for max_length, warned in (("512", False), ("null", True)):
        cfg = load_config(["--config", config, "--max_length", max_length], check_environment=False,
                          task="dpo" if config == "demo-dpo" else "sft")
        tokenizer = load_tokenizer(cfg)
        records.clear()
        assert len(tokenizer("word " * 700)["input_ids"]) > tokenizer.model_max_length
        assert any(INDEXING_WARNING in r for r in records) is warned, max_length


def test_check_finds_the_demo_model_outside_the_checkout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "--model", "trl_padfree/demo/model"]) == 0
    assert "advice: padding_free=True is safe for llama with attn_implementation='padfree'." in capsys.readouterr().out


def test_a_dpo_run_into_a_pipe_is_quiet_and_reports_prompt_once(tmp_path):
    """LoRA, precomputed reference log-probs, into a pipe: no warning, no bar; the run line and summary say prompt_once."""
    lines = (DEMO / "data" / "pref_train.jsonl").read_text(encoding="utf-8").splitlines()
    long = [json.loads(line) for line in lines if len(line) > 1400][:4]
    assert long  # pairs longer than the demo model's 512 tokens: transformers would warn about indexing errors
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(lines[:20]) + "\n" + "".join(json.dumps(r) + "\n" for r in long), encoding="utf-8")
    out = tmp_path / "out"
    proc = run_command("dpo", [
        "--config", "demo-dpo", "--train_file", str(data), "--eval_file", "", "--eval_strategy", "no",
        "--eval_on_start", "false", "--max_steps", "2", "--per_device_train_batch_size", "4",
        "--use_peft", "true", "--precompute_ref_log_probs", "true", "--output_dir", str(out)], cwd=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "Warning" not in text and "Computing reference log probs" not in text and "it/s]" not in text
    assert INDEXING_WARNING not in text
    run_line = next(line for line in proc.stdout.splitlines() if line.startswith("[trl-padfree] run: "))
    assert ", padding_free=True, prompt_once=True, peft=True, " in run_line
    summary = json.loads((out / "launch_summary.json").read_text(encoding="utf-8"))
    assert summary["prompt_once"] is True and "max_tokens_per_batch" not in summary


def test_an_sft_summary_keeps_max_tokens_per_batch_and_has_no_prompt_once(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["--config", "demo", "--max_steps", "1", "--max_train_examples", "8", "--eval_file", "",
                 "--eval_strategy", "no", "--eval_on_start", "false", "--save_strategy", "no",
                 "--output_dir", str(out)]) == 0
    summary = json.loads((out / "launch_summary.json").read_text(encoding="utf-8"))
    assert "max_tokens_per_batch" in summary and "prompt_once" not in summary
    stdout, stderr = capfd.readouterr()
    assert INDEXING_WARNING not in stdout + stderr and "prompt_once" not in stdout


@pytest.mark.slow
def test_two_ranks_on_a_cpu_only_machine_pick_use_cpu_themselves(tmp_path, monkeypatch):
    """A config without ``use_cpu``, two ranks, no GPU: the launch sets ``use_cpu: true`` (one DDP run over gloo)
    and says so, instead of refusing the run because the ranks did not join one process group."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    config = tmp_path / "no-use-cpu.yaml"
    text = (ROOT / "configs" / "demo.yaml").read_text(encoding="utf-8")
    config.write_text("\n".join(line for line in text.splitlines() if not line.startswith("use_cpu:")) + "\n")
    proc = run_command("train", ["--config", str(config), "--max_steps", "2", "--max_train_examples", "32", "--eval_file",
                                 "", "--eval_strategy", "no", "--eval_on_start", "false", "--save_strategy", "no",
                                 "--output_dir", str(tmp_path / "out")], ranks=2, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "[trl-padfree] use_cpu: true (several processes on a machine without a GPU" in proc.stdout
    summary = json.loads((tmp_path / "out" / "launch_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
