"""``trl-padfree train``: config parsing, validation and every bad-input case (exit 2, one line, nothing written).

Runs ``main(argv)`` in-process (one import of torch/transformers for the whole file) plus one real subprocess
of the ``trl-padfree`` command, so the "one line, no traceback" promise is checked end to end too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.utils import DistributedType
from launch_inputs import demo_argv, write_demo_data, write_yaml
from launch_runs import run_bad
from paths import CONFIGS, DEMO, ROOT

from trl_padfree.attention import flash_attn_available
from trl_padfree.launch import ConfigError, load_config, main


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few demo records as local JSONL (train + eval)."""
    return write_demo_data(tmp_path_factory.mktemp("launch-data"))


# ------------------------------------------------------------------------------------------- bad input


def test_unknown_key_in_yaml_names_the_closest(capsys, tmp_path, data_dir):
    config = write_yaml(tmp_path / "c.yaml", learning_rat=1e-3)
    argv = demo_argv(data_dir, tmp_path / "out")
    argv[1] = str(config)
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message == f"unknown key 'learning_rat' in {config}; did you mean 'learning_rate'?"


def test_unknown_option_on_the_command_line(capsys, tmp_path, data_dir):
    message = run_bad(capsys, demo_argv(data_dir, tmp_path / "out", "--response_templat", "x"), tmp_path / "out")
    assert message == "unknown option '--response_templat' on the command line; did you mean 'response_template'?"


def test_wrong_type_in_yaml(capsys, tmp_path, data_dir):
    config = write_yaml(tmp_path / "c.yaml", per_device_train_batch_size="four")
    argv = demo_argv(data_dir, tmp_path / "out")
    argv[1] = str(config)
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message == (
        f"wrong type for 'per_device_train_batch_size' in {config}: expected an integer, got 'four' (a string)"
    )


def test_wrong_type_on_the_command_line(capsys, tmp_path, data_dir):
    message = run_bad(capsys, demo_argv(data_dir, tmp_path / "out", "--learning_rate", "fast"), tmp_path / "out")
    assert message == "command line: argument --learning_rate/--learning-rate: invalid float value: 'fast'"


def test_invalid_choice_suggests_the_closest(capsys, tmp_path, data_dir):
    message = run_bad(capsys, demo_argv(data_dir, tmp_path / "out", "--lr_scheduler_type", "cosin"), tmp_path / "out")
    assert message.startswith("command line: argument --lr_scheduler_type")
    config = write_yaml(tmp_path / "c.yaml", dtype="bf16")
    argv = demo_argv(data_dir, tmp_path / "out")
    argv[1] = str(config)
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message == (
        f"invalid value for 'dtype' in {config}: 'bf16' is not one of 'auto', 'bfloat16', 'float16', 'float32'; "
        "did you mean 'bfloat16'?"
    )


def test_missing_data_file(capsys, tmp_path, data_dir):
    missing = tmp_path / "nope.jsonl"
    message = run_bad(capsys, demo_argv(data_dir, tmp_path / "out", "--train_file", str(missing)), tmp_path / "out")
    assert message.startswith(f"data file not found: train_file={str(missing)!r}")


def test_evaluation_without_eval_data(capsys, tmp_path, data_dir):
    message = run_bad(capsys, demo_argv(data_dir, tmp_path / "out", "--eval_file", ""), tmp_path / "out")
    assert message == (
        "eval_strategy is 'steps' but there is no eval data: set eval_file, eval_fraction or dataset_test_split "
        "(or eval_strategy: 'no')"
    )


def test_missing_config_file(capsys, tmp_path):
    message = run_bad(capsys, ["--config", str(tmp_path / "none.yaml")], tmp_path / "out")
    assert message.startswith(f"config file not found: {str(tmp_path / 'none.yaml')!r}")


def test_template_found_in_no_example(capsys, tmp_path, data_dir):
    argv = demo_argv(data_dir, tmp_path / "out", "--response_template", "### Reply:")
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message.startswith("response_template '### Reply:' was found in none of the first 24 examples")


def test_template_field_missing_from_data(capsys, tmp_path, data_dir):
    argv = demo_argv(data_dir, tmp_path / "out", "--template", "Q: {question}\n### Answer: {output}")
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message == "template uses field(s) 'question' that the data does not have; its fields are: instruction, output"


@pytest.fixture(scope="module")
def leaky_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random OPT (its sdpa mask ignores position_ids, so packed examples leak) with the demo tokenizer."""
    from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM

    out = tmp_path_factory.mktemp("opt")
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "model")
    config = OPTConfig(
        vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=2,
        word_embed_proj_dim=32, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    OPTForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_model_that_leaks_under_padding_free(capsys, tmp_path, data_dir, leaky_model):
    argv = demo_argv(data_dir, tmp_path / "out", "--model_name_or_path", str(leaky_model), "--attn_implementation", "sdpa")
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message.startswith("padding-free training is unsafe for this model: LEAKS: opt (attn_implementation='sdpa'")
    assert "padfree" in message  # the advice names the fix


def test_flash_attention_where_it_cannot_run(capsys, tmp_path, data_dir):
    # The demo config trains on the CPU (use_cpu: true), so this holds on a GPU machine too.
    message = run_bad(
        capsys, demo_argv(data_dir, tmp_path / "out", "--attn_implementation", "flash_attention_2"), tmp_path / "out"
    )
    assert message.startswith("attn_implementation 'flash_attention_2' needs a CUDA GPU and this run has none")


@pytest.mark.skipif(
    not torch.cuda.is_available() or flash_attn_available(), reason="needs a CUDA GPU without the flash-attn package"
)
def test_flash_attention_on_a_gpu_without_flash_attn(capsys, tmp_path, data_dir):
    argv = demo_argv(data_dir, tmp_path / "out", "--attn_implementation", "flash_attention_2", "--use_cpu", "false")
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message.startswith("attn_implementation 'flash_attention_2' needs the flash-attn package")


def test_missing_checkpoint_to_resume(capsys, tmp_path, data_dir):
    missing = tmp_path / "ckpt"
    argv = demo_argv(data_dir, tmp_path / "out", "--resume_from_checkpoint", str(missing))
    message = run_bad(capsys, argv, tmp_path / "out")
    assert message == f"checkpoint not found: resume_from_checkpoint={str(missing)!r} is not a directory"


def test_torch_num_threads_must_be_positive(capsys, tmp_path, data_dir):
    message = run_bad(capsys, demo_argv(data_dir, tmp_path / "out", "--torch_num_threads", "0"), tmp_path / "out")
    assert message == "invalid settings: torch_num_threads must be 'auto', a positive integer or None, got 0"


def test_packing_conflicts_with_the_collator(capsys, tmp_path, data_dir):
    message = run_bad(capsys, demo_argv(data_dir, tmp_path / "out", "--packing", "true"), tmp_path / "out")
    assert message.startswith("invalid settings: SFTConfig(padding_free=True, packing=True): padding_free flattens")


@pytest.mark.parametrize(("task", "argv", "message"), [
    ("dpo", ["--template", "x"], "unknown option '--template' on the command line (a field of trl-padfree train, not "
                                 "of trl-padfree dpo)"),
    ("sft", ["--prompt_once", "true"], "unknown option '--prompt_once' on the command line (a field of "
                                       "trl-padfree dpo, not of trl-padfree train)"),
    ("grpo", ["--reward_func", "x"], "unknown option '--reward_func' on the command line; did you mean "
                                     "'reward_funcs'?"),
])
def test_a_field_of_another_trainer_is_named(task, argv, message):
    from trl_padfree.launch.config import parse_arguments

    with pytest.raises(ConfigError) as caught:
        parse_arguments(argv, task=task)
    assert str(caught.value) == message


@pytest.mark.parametrize("task", ["sft", "dpo", "grpo", "rloo", "reward", "kto"])
def test_every_field_of_the_config_class_is_a_key(task, tmp_path):
    """``trl-padfree TASK --config`` takes every field of this package's config class of the trainer."""
    import dataclasses

    from trl_padfree.launch.config import argument_classes, build_parser

    _, config_class, _ = argument_classes(task)
    keys = {a.dest for a in build_parser(task)._actions}
    assert {f.name for f in dataclasses.fields(config_class) if f.init} <= keys
    assert {"padding_free", "check_packing", "torch_num_threads"} <= keys


def test_bad_input_through_the_real_command(tmp_path, data_dir):
    """The installed-command path: a subprocess prints one line on stderr, no traceback, exit code 2."""
    argv = demo_argv(data_dir, tmp_path / "out", "--max_step", "3")
    proc = subprocess.run(
        [sys.executable, "-m", "trl_padfree.cli", "train", *argv],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "trl-padfree train: error: unknown option '--max_step' on the command line; did you mean 'max_steps'?"
    ]
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- resolution


def test_demo_config_resolves(data_dir, tmp_path):
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--learning_rate", "5e-4"))
    assert cfg.padding_free is True and cfg.training.padding_free is False  # the launch's collator flattens
    assert cfg.attn_implementation == ("padfree" if not torch.cuda.is_available() else cfg.attn_implementation)
    assert cfg.training.learning_rate == 5e-4  # the command line wins over the file (3e-3)
    assert cfg.training.max_steps == 2
    assert cfg.training.dataset_kwargs == {"skip_prepare_dataset": True}
    assert cfg.training.response_template == "### Answer:"
    assert cfg.data.template == "### Question: {instruction}\n### Answer: {output}"
    assert not (tmp_path / "out").exists()


def test_chat_demo_config_resolves(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the demo configs name their files relative to the repository root
    cfg = load_config(["--config", str(CONFIGS / "demo-chat.yaml"), "--output_dir", str(tmp_path / "out")])
    assert cfg.training.instruction_template is None and cfg.training.response_template is None  # chat masks
    assert cfg.data.train_file == "trl_padfree/demo/data/chat_train.jsonl" and cfg.data.template is None
    assert cfg.training.torch_num_threads == 1


def test_padding_free_false_reaches_the_collator(data_dir, tmp_path):
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--padding_free", "false"))
    assert cfg.padding_free is False and cfg.training.padding_free is False


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama3-8b-flash.yaml", {"attn": "flash_attention_2", "peft": False, "data": "HuggingFaceH4/ultrachat_200k"}),
        ("mistral-7b-lora.yaml", {"attn": "auto", "peft": True, "data": "tatsu-lab/alpaca"}),
    ],
)
def test_real_model_configs_parse_and_resolve(name, expected):
    """Every key and type goes through the same path as a run; nothing is downloaded or loaded.

    ``use_cpu`` is overridden because ``SFTConfig`` itself refuses bf16 without a GPU at construction.
    """
    cfg = load_config(["--config", str(CONFIGS / name), "--use_cpu", "true"], check_environment=False)
    assert cfg.attn_implementation == expected["attn"]
    assert cfg.model.dtype == "bfloat16" and cfg.training.bf16 is True
    assert cfg.model.use_peft is expected["peft"]
    assert cfg.data.dataset_name == expected["data"]
    assert cfg.padding_free is True and cfg.training.padding_free is False
    assert cfg.training.gradient_checkpointing is True
    if expected["peft"]:
        assert cfg.model.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        assert cfg.data.eval_fraction == 0.02
    else:
        assert cfg.training.instruction_template == [
            "<|start_header_id|>user<|end_header_id|>\n\n",
            "<|start_header_id|>system<|end_header_id|>\n\n",
        ]


def test_real_model_config_fails_clearly_on_this_machine():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU-only message does not apply")
    with pytest.raises(ConfigError, match=r"^invalid settings: bf16: true needs a GPU with bfloat16 support"):
        load_config(["--config", str(CONFIGS / "llama3-8b-flash.yaml")])


@pytest.mark.parametrize(
    ("name", "kind"),
    [("ddp", DistributedType.MULTI_GPU), ("fsdp", DistributedType.FSDP), ("deepspeed-zero3", DistributedType.DEEPSPEED)],
)
def test_accelerate_configs_load_with_accelerate(name, kind):
    config = load_config_from_file(str(CONFIGS / "accelerate" / f"{name}.yaml"))
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type == kind
    assert config.num_machines == 1 and config.mixed_precision == "bf16"
    if kind == DistributedType.FSDP:
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    if kind == DistributedType.DEEPSPEED:
        assert config.deepspeed_config["zero_stage"] == 3


def test_every_shipped_config_is_checked():
    shipped = {p.name for p in CONFIGS.glob("*.yaml")} | {f"accelerate/{p.name}" for p in (CONFIGS / "accelerate").glob("*.yaml")}
    assert shipped == {
        "demo.yaml", "demo-chat.yaml", "llama3-8b-flash.yaml", "mistral-7b-lora.yaml",
        "demo-dpo.yaml",  # run (trl-padfree dpo) in test_launch_dpo.py
        "demo-grpo.yaml",  # run (trl-padfree grpo) in test_launch_grpo.py
        "demo-reward.yaml",  # run (trl-padfree reward) in test_launch_reward.py
        "demo-kto.yaml",  # run (trl-padfree kto) in test_launch_kto.py
        "demo-real.yaml",  # resolved below; run by make demo-real (the real model is downloaded there)
        "accelerate/ddp.yaml", "accelerate/fsdp.yaml", "accelerate/deepspeed-zero3.yaml",
        "accelerate/cpu-ddp.yaml",  # checked (and run with 2 ranks) in test_distributed.py
    }  # fmt: skip


def test_env_mapping_sets_variables(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("TRL_PADFREE_TEST_ENV", "before")  # (restored after the test: TRL sets os.environ)
    config = write_yaml(tmp_path / "c.yaml", env={"TRL_PADFREE_TEST_ENV": 7})
    argv = demo_argv(data_dir, tmp_path / "out")
    argv[1] = str(config)
    load_config(argv)
    assert os.environ["TRL_PADFREE_TEST_ENV"] == "7"


@pytest.mark.parametrize(("task", "present", "absent"), [
    ("sft", ("--response_template", "--padding_free", "--template", "--model_name_or_path"), ("--prompt_once",)),
    ("dpo", ("--prompt_once", "--beta", "--chat_template_path"), ("--response_template",)),
    ("grpo", ("--reward_funcs", "--prompt_once", "--num_generations"), ("--response_template",)),
])
def test_help_lists_the_fields_of_the_trainer(capsys, task, present, absent):
    assert main(["--help"], task=task) == 0
    out = capsys.readouterr().out
    command = "train" if task == "sft" else task
    assert out.startswith(f"usage: trl-padfree {command} --config configs/NAME.yaml [--field value ...]")
    assert all(f"{name} " in out for name in present) and not any(f"{name} " in out for name in absent)


def test_resume_true_means_the_newest_complete_checkpoint_of_this_run(tmp_path, data_dir):
    from trl_padfree.launch.resume import CHECKPOINT_MARKER, RUN_FILE, write_json

    out = tmp_path / "out"
    out.mkdir()
    write_json(str(out / RUN_FILE), {"run_id": "r1", "status": "interrupted"})
    for step in (2, 10, 4):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"w")
        if step != 10:  # checkpoint-10 was never completed
            write_json(str(out / f"checkpoint-{step}" / CHECKPOINT_MARKER), {"run_id": "r1", "step": step})
    cfg = load_config(demo_argv(data_dir, out, "--resume_from_checkpoint", "true"))
    assert cfg.resume_from_checkpoint == str(out / "checkpoint-4") and cfg.run_id == "r1"
    assert cfg.notes == [
        f"resuming from {out / 'checkpoint-4'} (step 4, the newest complete checkpoint of this run); passed over: "
        "checkpoint-10 (incomplete (no trl-padfree completion marker: the save was interrupted, or another tool "
        "wrote it))"
    ]
    with pytest.raises(ConfigError, match=r"holds no trl-padfree run to resume \(it holds no checkpoint-N directory\)"):
        load_config(demo_argv(data_dir, tmp_path / "empty", "--resume_from_checkpoint", "last"))


def test_a_validated_config_is_frozen_and_validation_leaves_the_parsed_one_as_it_was(data_dir, tmp_path):
    """``validate_config`` returns the resolved config, a new one (the parsed config and its TRL objects are as
    parsed); no field of it can be assigned."""
    import dataclasses

    from trl_padfree.launch.config import parse_arguments
    from trl_padfree.launch.validate import validate_config

    parsed = parse_arguments(demo_argv(data_dir, tmp_path / "out", "--eval_file", "", "--eval_strategy", "no",
                                       "--eval_on_start", "false"))
    cfg = validate_config(parsed)
    assert cfg is not parsed and cfg.run_id and parsed.run_id is None
    assert cfg.attn_implementation != "auto" and parsed.attn_implementation == "auto"
    assert cfg.data.eval_file is None and parsed.data.eval_file == ""
    assert cfg.training.padding_free is False and parsed.training.padding_free is True  # SFT: the collator flattens
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.run_id = "other"


def test_real_model_demo_config_resolves():
    """make demo-real's config (SmolLM2-135M, downloaded by scripts/real_model.py): every key and type goes through
    the same path as a run, with its shipped chat data; nothing is downloaded or loaded."""
    import yaml

    assert yaml.safe_load((CONFIGS / "demo-real.yaml").read_text())["model_name_or_path"] == ".cache/smollm2-135m"
    # the checkpoint exists only after scripts/real_model.py fetch: the demo model stands in for it here
    cfg = load_config(["--config", str(CONFIGS / "demo-real.yaml"), "--model_name_or_path", str(DEMO / "model")],
                      check_environment=False)
    assert cfg.task == "sft" and cfg.padding_free is True and cfg.attn_implementation == "auto"
    for path in (cfg.data.train_file, cfg.data.eval_file):
        assert (ROOT / path).is_file(), path
