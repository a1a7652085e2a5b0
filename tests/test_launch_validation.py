"""``trl-padfree train``: bad *values* (valid YAML, valid types) are refused before anything is loaded or written.

Every case: exit code 2, exactly one line on stderr that names the fix, and no ``output_dir`` created (issue 12).
Runs ``main(argv)`` in-process on ``tests/launch_inputs.py``'s demo command line and data.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from launch_inputs import DEMO_YAML, demo_argv, write_demo_data, write_yaml
from launch_runs import assert_refused_in_one_line, run_command
from paths import DEMO
from trl import get_peft_config

from trl_padfree.launch import load_config
from trl_padfree.launch.model import check_lora_targets
from trl_padfree.launch.validate import describe
from trl_padfree.testing import tiny_llama


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_data(tmp_path_factory.mktemp("validation-data"))


def test_a_value_error_is_one_line_through_the_real_command(tmp_path, data_dir):
    """No warning of the launcher's own defaults (issue 12: a config without activation_checkpointing) precedes the
    error (checked outside pytest's warning capture)."""
    proc = run_command("train", ["--model_name_or_path", str(DEMO / "model"), "--train_file", str(data_dir / "train.jsonl"),
                                 "--output_dir", str(tmp_path / "out"), "--per_device_eval_batch_size", "0"], timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert proc.stderr.splitlines() == ["trl-padfree train: error: per_device_eval_batch_size must be at least 1, got 0"]


# (output_dir in tmp_path, which holds a file "file", a run "run" and an incomplete checkpoint "ckpt"; extra
# arguments; the line, {tmp} standing for tmp_path)
PATH_CASES = [
    ("file", (), "output_dir '{tmp}/file' is a file, not a directory; choose another output_dir"),
    ("file/run/out", (), "output_dir '{tmp}/file/run/out' cannot be created: '{tmp}/file' is a file; choose another "
     "output_dir"),
    ("run", ("--overwrite_output_dir", "false"),  # (the demo config sets it to true)
     "output_dir '{tmp}/run' already holds a run (checkpoint-3); continue it with resume_from_checkpoint: true, start "
     "over in it with overwrite_output_dir: true, or choose another output_dir"),
    ("out", ("--resume_from_checkpoint", "{tmp}/ckpt"),
     "resume_from_checkpoint='{tmp}/ckpt' is not a complete checkpoint: it has no readable trainer_state.json (the save "
     "was interrupted?); pass a checkpoint-N directory (or true for the newest complete one of the run in output_dir)"),
]


@pytest.mark.parametrize(("out", "extra", "message"), PATH_CASES)
def test_an_unusable_output_dir_or_checkpoint_is_refused_and_left_as_it_was(tmp_path, data_dir, out, extra, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "run" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "run" / "notes.txt").write_text("mine")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"")
    before = sorted(tmp_path.rglob("*"))
    argv = demo_argv(data_dir, tmp_path / out, *(a.format(tmp=tmp_path) for a in extra))
    assert assert_refused_in_one_line("sft", argv, tmp_path / "none") == message.format(tmp=tmp_path)
    assert sorted(tmp_path.rglob("*")) == before and (tmp_path / "file").read_text() == "x"
    if out == "run":  # overwrite_output_dir: true starts a new run there
        cfg = load_config(demo_argv(data_dir, tmp_path / "run", "--overwrite_output_dir", "true"))
        assert cfg.training.resume_from_checkpoint is None and len(cfg.run_id) == 32


def test_output_dir_not_writable(tmp_path, data_dir):
    if os.geteuid() == 0:  # root writes anywhere a mode allows; /proc/1 refuses new files even to root
        parent = Path("/proc/1")
        if not parent.is_dir():
            pytest.skip("needs /proc")
    else:
        parent = tmp_path / "locked"
        parent.mkdir(mode=0o555)
    message = assert_refused_in_one_line("sft", demo_argv(data_dir, parent / "out"), parent / "out")
    assert message.startswith(f"output_dir {str(parent / 'out')!r} cannot be created in {str(parent)!r} (")
    assert message.endswith("); choose a directory you can write to")


def test_config_with_non_utf8_bytes(tmp_path, data_dir):
    config = tmp_path / "c.yaml"
    config.write_bytes(DEMO_YAML.read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    offset = len(DEMO_YAML.read_bytes()) + len("# caf")
    message = assert_refused_in_one_line("sft", demo_argv(data_dir, tmp_path / "out", config=config), tmp_path / "out")
    assert message == f"{config}: not UTF-8 text (byte 0xe9 at offset {offset}); save the file as UTF-8"


def test_remote_code_is_in_the_run_line_and_model_init_kwargs_go_to_the_launcher(tmp_path, data_dir):
    assert "trust_remote_code" not in describe(load_config(demo_argv(data_dir, tmp_path / "out")))
    config = write_yaml(tmp_path / "c.yaml", model_init_kwargs={"low_cpu_mem_usage": True})
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--trust_remote_code", "true", config=config))
    assert describe(cfg)["trust_remote_code"] is True and cfg.model_init_kwargs == {"low_cpu_mem_usage": True}
    assert cfg.training.model_init_kwargs is None  # TRL would print that it ignores them


def test_tokenizer_larger_than_the_embeddings(tmp_path, data_dir, demo_tokenizer):
    tiny_llama(vocab_size=700).save_pretrained(tmp_path / "m")
    demo_tokenizer.save_pretrained(tmp_path / "m")  # (768 tokens)
    argv = demo_argv(data_dir, tmp_path / "out", "--model_name_or_path", str(tmp_path / "m"))
    assert assert_refused_in_one_line("sft", argv, tmp_path / "out") == (
        f"the tokenizer of {str(tmp_path / 'm')!r} has 768 token ids but the model's embeddings hold 700 (vocab_size): "
        "use the tokenizer that belongs to this model, or resize the model's embeddings to 768 "
        "(model.resize_token_embeddings) and save it")


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
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--use_peft", "true", "--lora_target_modules", "q_proj"))
    assert get_peft_config(cfg.model).target_modules == {"q_proj"}
    check_lora_targets(cfg, tiny_llama())  # matches model.layers.*.self_attn.q_proj


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
