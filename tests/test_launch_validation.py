"""``trl-padfree train``: bad *values* (valid YAML, valid types) are refused before anything is loaded or written.

Every case: exit code 2, exactly one line on stderr that names the fix, and no ``output_dir`` created (issue 12).
Runs ``main(argv)`` in-process on ``tests/launch_inputs.py``'s demo command line and data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_inputs import DEMO_YAML, demo_argv, write_demo_data, write_yaml
from launch_runs import assert_refused_in_one_line
from paths import DEMO, ROOT

from trl_padfree.launch import load_config
from trl_padfree.launch.validate import describe


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_data(tmp_path_factory.mktemp("validation-data"))


# ------------------------------------------------------------------------------------------- values
# (bad values refused in one line: tests/test_launch_config.py's BAD_INPUT)


def test_a_step_interval_is_checked_only_under_its_strategy(tmp_path, data_dir):
    """(``--save_strategy steps --save_steps 0`` is refused: BAD_INPUT)"""
    load_config(demo_argv(data_dir, tmp_path / "out", "--save_strategy", "no", "--save_steps", "0"))


def test_a_value_error_is_one_line_through_the_real_command(tmp_path, data_dir):
    """No warning of the launcher's own defaults (issue 12: a config without activation_checkpointing) precedes the
    error (checked outside pytest's warning capture)."""
    argv = ["--model_name_or_path", str(DEMO / "model"), "--train_file", str(data_dir / "train.jsonl"), "--output_dir",
            str(tmp_path / "out"), "--per_device_eval_batch_size", "0"]
    proc = subprocess.run([sys.executable, "-m", "trl_padfree.cli", "train", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "trl-padfree train: error: per_device_eval_batch_size must be at least 1, got 0"
    ]
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- output_dir


@pytest.mark.parametrize(("below", "message"), [
    ("", "output_dir {out!r} is a file, not a directory; choose another output_dir"),
    ("run/out", "output_dir {out!r} cannot be created: {file!r} is a file; choose another output_dir"),
])
def test_output_dir_that_is_or_is_under_a_file(tmp_path, data_dir, below, message):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / below
    assert assert_refused_in_one_line("sft", demo_argv(data_dir, out), tmp_path / "none") == message.format(
        out=str(out), file=str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "x"


def test_output_dir_not_writable(tmp_path, data_dir):
    if os.geteuid() == 0:  # root writes anywhere a mode allows; /proc/1 refuses new files even to root
        parent = Path("/proc/1")
        if not parent.is_dir():
            pytest.skip("needs /proc")
    else:
        parent = tmp_path / "locked"
        parent.mkdir(mode=0o555)
    out = parent / "out"
    message = assert_refused_in_one_line("sft", demo_argv(data_dir, out), out)
    assert message.startswith(f"output_dir {str(out)!r} cannot be created in {str(parent)!r} (")
    assert message.endswith("); choose a directory you can write to")


def test_output_dir_holding_another_run(tmp_path, data_dir):
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    argv = demo_argv(data_dir, out, "--overwrite_output_dir", "false")  # (the demo config sets it to true)
    message = assert_refused_in_one_line("sft", argv, tmp_path / "none")
    assert message == (
        f"output_dir {str(out)!r} already holds a run (checkpoint-3); continue it with resume_from_checkpoint: true, "
        "start over in it with overwrite_output_dir: true, or choose another output_dir"
    )
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-3", "notes.txt"]
    cfg = load_config(demo_argv(data_dir, out, "--overwrite_output_dir", "true"))
    assert cfg.resume_from_checkpoint is None and len(cfg.run_id) == 32


# ------------------------------------------------------------------------------------------- resume path


def test_resume_path_that_is_not_a_checkpoint(tmp_path, data_dir):
    path = tmp_path / "not-a-checkpoint"
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    argv = demo_argv(data_dir, tmp_path / "out", "--resume_from_checkpoint", str(path))
    message = assert_refused_in_one_line("sft", argv, tmp_path / "out")
    assert message == (
        f"resume_from_checkpoint={str(path)!r} is not a complete checkpoint: it has no readable trainer_state.json "
        "(the save was interrupted?); pass a checkpoint-N directory (or true for the newest complete one of the run "
        "in output_dir)"
    )


# ------------------------------------------------------------------------------------------- config file and env


def test_config_with_non_utf8_bytes(tmp_path, data_dir):
    config = tmp_path / "c.yaml"
    config.write_bytes(DEMO_YAML.read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    offset = len(DEMO_YAML.read_bytes()) + len("# caf")
    message = assert_refused_in_one_line("sft", demo_argv(data_dir, tmp_path / "out", config=config), tmp_path / "out")
    assert message == f"{config}: not UTF-8 text (byte 0xe9 at offset {offset}); save the file as UTF-8"


# ------------------------------------------------------------------------------------------- trust_remote_code


def test_the_run_line_says_when_remote_code_is_trusted(tmp_path, data_dir):
    assert "trust_remote_code" not in describe(load_config(demo_argv(data_dir, tmp_path / "out")))
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--trust_remote_code", "true"))
    assert describe(cfg)["trust_remote_code"] is True


def test_model_init_kwargs_are_applied_by_the_launcher_not_trl(tmp_path, data_dir):
    config = write_yaml(tmp_path / "c.yaml", model_init_kwargs={"low_cpu_mem_usage": True})
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", config=config))
    assert cfg.model_init_kwargs == {"low_cpu_mem_usage": True}
    assert cfg.training.model_init_kwargs is None  # TRL would print that it ignores them


# ------------------------------------------------------------------------------------------- model checks


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose embeddings hold 700 rows, saved with the demo tokenizer (768 tokens)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from trl_padfree.testing import tiny_llama_config

    out = tmp_path_factory.mktemp("small-vocab")
    config = tiny_llama_config(vocab_size=700, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(DEMO / "model").save_pretrained(out)
    return out


def test_tokenizer_larger_than_the_embeddings(tmp_path, data_dir, small_vocab_model):
    argv = demo_argv(data_dir, tmp_path / "out", "--model_name_or_path", str(small_vocab_model))
    assert assert_refused_in_one_line("sft", argv, tmp_path / "out") == (
        f"the tokenizer of {str(small_vocab_model)!r} has 768 token ids but the model's embeddings hold 700 "
        "(vocab_size): use the tokenizer that belongs to this model, or resize the model's embeddings to 768 "
        "(model.resize_token_embeddings) and save it"
    )


# ------------------------------------------------------------------------------------------- data


def _lines(*records: dict) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


_NESTED = ("train_file: template field {output} holds lists or mappings, which would be trained as their Python text; "
           "pick an element ({output[0]}, {output.key}) or make 'output' text")
_NO_EVAL = ("--eval_strategy", "no", "--eval_on_start", "false", "--eval_file", "")
# (the bytes of train_file, None for a directory of its name; arguments added; the one line, PATH and GLOB standing
# for the file's path and a glob in it, "..." at the end for a line that goes on with the parser's reason)
DATA_CASES = {
    "null or missing completion": (
        _lines({"instruction": "hi", "output": "hello"}, {"instruction": "hi", "output": None}, {"instruction": "x"}),
        (), "train_file record 1 (counting from 0): 'output' is null or missing (and 1 more); fill it in or remove the "
        "record"),
    "empty completion, named in file order after eval_fraction shuffled": (
        _lines(*[{"instruction": f"q{i}", "output": "a"} for i in range(9)], {"instruction": "q", "output": "  "}),
        ("--eval_file", "", "--eval_fraction", "0.3"),
        "train_file record 9 (counting from 0): 'output' is empty; fill it in or remove the record"),
    "null completion of prompt/completion records": (
        _lines({"prompt": "### Question: a\n### Answer:", "completion": " b"},
               {"prompt": "### Question: c\n### Answer:", "completion": None}), ("--template", "", *_NO_EVAL),
        "train_file record 1 (counting from 0): 'completion' is null or missing; fill it in or remove the record"),
    "template field holding mappings": (
        _lines({"instruction": "hi", "output": {"a": "a"}}, {"instruction": "hi", "output": {"a": "hello"}}), (),
        _NESTED),
    "template field holding a list among strings": (
        _lines({"instruction": "hi", "output": "a"}, {"instruction": "hi", "output": [1, 2]}), (), _NESTED),
    "empty file": (b"", (), "train_file file PATH is empty (0 bytes): it holds no records"),
    "a directory named like a data file": (
        None, (), "train_file=PATH matches the directory PATH: point it at data files (e.g. a glob such as GLOB), or "
        "use dataset_name for a saved dataset directory"),
    "binary file": (
        (DEMO / "model" / "model.safetensors").read_bytes()[:4096], (),
        "train_file file PATH is not text (byte 0x00 at offset 2): expected JSON Lines (one JSON object per line) in "
        "UTF-8"),
    "text that is not JSON": (b"just some notes\n", (), "could not read train_file=PATH: JSON parse error..."),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_is_refused_in_one_line_naming_the_record_or_file(tmp_path, data_dir, case):
    content, extra, expected = DATA_CASES[case]
    train = tmp_path / "train.jsonl"
    if content is None:
        train.mkdir()
    else:
        train.write_bytes(content)
    expected = expected.replace("PATH", repr(str(train))).replace("GLOB", repr(str(train / "*.jsonl")))
    argv = demo_argv(data_dir, tmp_path / "out", "--train_file", str(train), *extra)
    message = assert_refused_in_one_line("sft", argv, tmp_path / "out")
    assert message.startswith(expected[:-3]) if expected.endswith("...") else message == expected


def test_a_single_lora_target_is_a_module_name_not_a_regular_expression(tmp_path, data_dir):
    """TRL hands a one-element lora_target_modules to peft as a string, i.e. a regular expression over full module
    names, which "q_proj" never matches (peft then fails when the trainer is built)."""
    from trl import get_peft_config

    from trl_padfree.launch.model import check_lora_targets
    from trl_padfree.testing import tiny_llama

    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--use_peft", "true", "--lora_target_modules", "q_proj"))
    assert get_peft_config(cfg.model).target_modules == {"q_proj"}
    check_lora_targets(cfg, tiny_llama())  # matches model.layers.*.self_attn.q_proj


def test_trl_refusing_settings_at_trainer_construction_is_one_line_and_leaves_no_output_dir(tmp_path, data_dir):
    """TRL's own check, run where TRL runs it (building the trainer, after transformers created output_dir)."""
    argv = demo_argv(data_dir, tmp_path / "out", "--router_aux_loss_coef", "0.5")
    assert assert_refused_in_one_line("sft", argv, tmp_path / "out") == (
        "SFTTrainer refused the settings: `router_aux_loss_coef` is set to 0.5 but LlamaForCausalLM is not a "
        "Mixture-of-Experts model that returns its router logits, so there is no auxiliary loss to weight."
    )


@pytest.fixture(scope="module")
def hub_not_found():
    """A local stand-in for the hub: 404 RepoNotFound to everything, as the hub answers for an unknown or private id."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


# (HF_HUB_OFFLINE, the hub: a local port nothing listens on, or the stand-in above; the line, "..." standing for the
# library's own reason)
HUB_CASES = {
    "offline": (True, "http://127.0.0.1:9", "could not load dataset_name='nobody/no-such-dataset': ...(HF_HUB_OFFLINE is "
                "set and it is not in the local cache: unset it to download the dataset, or set dataset_name to a local "
                "dataset directory)"),
    "unreachable": (False, "http://127.0.0.1:9", "cannot reach the Hugging Face Hub to load dataset_name="
                    "'nobody/no-such-dataset' (...); set HF_HUB_OFFLINE=1 to use a cached copy, or set dataset_name to "
                    "a local dataset directory"),
    "not found": (False, None, "dataset_name='nobody/no-such-dataset' is not on the Hugging Face Hub, or is private or "
                  "gated (log in with `hf auth login`); check the id or set dataset_name to a local dataset directory"),
}


@pytest.mark.parametrize("case", list(HUB_CASES))
def test_a_hub_dataset_that_cannot_be_had_fails_fast(tmp_path, data_dir, monkeypatch, hub_not_found, case):
    """One line within seconds instead of datasets' ~30 s of retries; no network used."""
    import datasets
    from huggingface_hub import constants

    offline, endpoint, expected = HUB_CASES[case]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint or hub_not_found)
    argv = demo_argv(data_dir, tmp_path / "out", "--train_file", "", "--eval_file", "", "--eval_strategy", "no",
                     "--eval_on_start", "false", "--dataset_name", "nobody/no-such-dataset")
    began = time.perf_counter()
    message = assert_refused_in_one_line("sft", argv, tmp_path / "out")
    assert time.perf_counter() - began < 10
    start, _, end = expected.partition("...")
    assert message.startswith(start) and message.endswith(end) if end else message == expected
