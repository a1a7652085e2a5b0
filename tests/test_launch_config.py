"""The launch's config: parsing and resolution, and bad input of every trainer (exit 2, one line, nothing
written)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.utils import DistributedType
from launch_inputs import DEMO_YAML, demo_argv, write_demo_data, write_yaml
from launch_runs import assert_refused_in_one_line, demo_pairs_argv
from paths import CONFIGS, DEMO, ROOT
from tiny_models import save_tiny_model

from trl_padfree.attention import flash_attn_available
from trl_padfree.launch import ConfigError, load_config, main
from trl_padfree.launch.config import argument_classes, build_parser

NO_FLASH_GPU = not torch.cuda.is_available() or flash_attn_available()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_data(tmp_path_factory.mktemp("launch-data"))


# (changes to the demo config, extra arguments, the error line: exact, or its start and end around "..."; {tmp} is
# the test's tmp_path, {config} the changed config)
BAD_INPUT = [
    ({"learning_rat": 1e-3}, [], "unknown key 'learning_rat' in {config}; did you mean 'learning_rate'?"),
    (None, ["--response_templat", "x"],
     "unknown option '--response_templat' on the command line; did you mean 'response_template'?"),
    ({"per_device_train_batch_size": "four"}, [],
     "wrong type for 'per_device_train_batch_size' in {config}: expected an integer, got 'four' (a string)"),
    (None, ["--learning_rate", "fast"],
     "command line: argument --learning_rate/--learning-rate: invalid float value: 'fast'"),
    (None, ["--lr_scheduler_type", "cosin"], "command line: argument --lr_scheduler_type..."),
    ({"model_init_kwargs": {"trust_remote_code": True}}, [], "model_init_kwargs may not set 'trust_remote_code': it "
     "has its own field; set trust_remote_code: true instead"),
    ({"eval_strategy": False}, [], "wrong type for 'eval_strategy' in {config}: expected one of 'no', 'steps', "
                                   "'epoch', got False (a boolean); quote it: 'no' (YAML reads a bare no as false)"),
    ({"dtype": "bf16"}, [], "invalid value for 'dtype' in {config}: 'bf16' is not one of 'auto', 'bfloat16', "
                            "'float16', 'float32'; did you mean 'bfloat16'?"),
    (None, ["--train_file", "{tmp}/nope.jsonl"], "data file not found: train_file='{tmp}/nope.jsonl'..."),
    (None, ["--eval_file", ""], "eval_strategy is 'steps' but there is no eval data: set eval_file, eval_fraction or "
                                "dataset_test_split (or eval_strategy: 'no')"),
    (None, ["--eval_file", "", "--eval_strategy", "no"],  # (the demo config evaluates on start)
     "eval_on_start is true but there is no eval data: set eval_file, eval_fraction or dataset_test_split "
     "(or eval_on_start: false)"),
    (None, ["--response_template", "### Reply:"],
     "response_template '### Reply:' was found in none of the first 24 examples..."),
    (None, ["--template", "Q: {question}\n### Answer: {output}"],
     "template uses field(s) 'question' that the data does not have; its fields are: instruction, output"),
    # the demo config trains on the CPU (use_cpu: true), so this holds on a GPU machine too
    (None, ["--attn_implementation", "flash_attention_2"],
     "attn_implementation 'flash_attention_2' needs a CUDA GPU and this run has none..."),
    pytest.param(None, ["--attn_implementation", "flash_attention_2", "--use_cpu", "false"],
                 "attn_implementation 'flash_attention_2' needs the flash-attn package...",
                 marks=pytest.mark.skipif(NO_FLASH_GPU, reason="needs a CUDA GPU without the flash-attn package")),
    (None, ["--attn_implementation", "flash_attention2"],
     "attn_implementation 'flash_attention2' is not one of auto, eager, ...; did you mean 'flash_attention_2'?"),
    ({"report_to": "tensorbord"}, [], "report_to 'tensorbord' is not one of ...all, none; did you mean 'tensorboard'?"),
    (None, ["--resume_from_checkpoint", "{tmp}/ckpt"],
     "checkpoint not found: resume_from_checkpoint='{tmp}/ckpt' is not a directory"),
    (None, ["--torch_num_threads", "0"],
     "invalid settings: torch_num_threads must be 'auto', a positive integer or None, got 0"),
    (None, ["--packing", "true"],
     "invalid settings: SFTConfig(padding_free=True, packing=True): padding_free flattens..."),
    (None, ["--torch_empty_cache_steps", "0"],  # transformers' own check, at parse time
     "invalid settings: `torch_empty_cache_steps` must be an integer bigger than 0, got 0."),
    # bad values (valid YAML, valid types): each kind of range once
    (None, ["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be at least 1, got 0"),
    (None, ["--learning_rate", "nan"], "learning_rate must be at least 0, got nan"),
    (None, ["--seed", "-1"], "seed must be at least 0 and at most 4294967295, got -1"),
    (None, ["--adam_beta2", "1.0"], "adam_beta2 must be at least 0 and less than 1, got 1.0"),
    (None, ["--eval_fraction", "1.0"], "eval_fraction must be greater than 0 and less than 1, got 1.0"),
    (None, ["--max_grad_norm", "-1"], "max_grad_norm must be at least 0 (0 turns gradient clipping off), got -1.0"),
    (None, ["--save_strategy", "steps", "--save_steps", "0"],
     "save_steps must be greater than 0 (a number of steps, or a fraction of the run below 1), got 0.0"),
    (None, ["--max_steps", "0"], "max_steps must be at least 1 (or -1 to train for num_train_epochs), got 0"),
    (None, ["--max_steps", "-1", "--num_train_epochs", "0"],
     "num_train_epochs must be greater than 0 (or set max_steps to a number of steps), got 0.0"),
    (None, ["--output_dir", ""],
     "output_dir is empty: set the directory for checkpoints and the model, e.g. outputs/run1"),
    (None, ["--router_aux_loss_coef", "0.5"],  # TRL's check, when the trainer is built (after output_dir is made)
     "SFTTrainer refused the settings: `router_aux_loss_coef` is set to 0.5 but LlamaForCausalLM is not a "
     "Mixture-of-Experts model that returns its router logits, so there is no auxiliary loss to weight."),
    (None, ["--use_peft", "true", "--lora_dropout", "1.5"],  # torch's check, when the trainer is built
     "SFTTrainer refused the settings: dropout probability has to be between 0 and 1, but got 1.5"),
    (None, ["--use_peft", "true", "--lora_task_type", "BOGUS"],  # peft's, before loading
     "invalid LoRA settings (peft.LoraConfig): Invalid task type: 'BOGUS'. Must be one of the following task types: "
     "SEQ_CLS, SEQ_2_SEQ_LM, CAUSAL_LM, TOKEN_CLS, QUESTION_ANS, FEATURE_EXTRACTION."),
    (None, ["--use_peft", "true", "--lora_target_modules", "q_proj", "qkv"],
     f"lora_target_modules 'qkv' match no module of {str(DEMO / 'model')!r}; its linear layers are named "
     "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj (or use all-linear)"),
]


@pytest.mark.parametrize(("changes", "extra", "message"), BAD_INPUT)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, data_dir, changes, extra, message):
    config = DEMO_YAML if changes is None else write_yaml(tmp_path / "c.yaml", **changes)
    argv = demo_argv(data_dir, tmp_path / "out", *(a.replace("{tmp}", str(tmp_path)) for a in extra), config=config)
    start, dots, end = message.replace("{tmp}", str(tmp_path)).replace("{config}", argv[1]).partition("...")
    line = assert_refused_in_one_line("sft", argv, tmp_path / "out")
    assert line.startswith(start) and line.endswith(end) if dots else line == start


def test_a_config_that_is_no_file_lists_the_built_in_configs(tmp_path, monkeypatch):
    """``--config demo-kto``: the built-in names, and the files of configs/ where there is one."""
    for cwd, tail in ((tmp_path, "demo-dpo"), (ROOT, "configs/mistral-7b-lora.yaml; did you mean "
                                                     "'configs/demo-kto.yaml'?")):
        monkeypatch.chdir(cwd)
        line = assert_refused_in_one_line("kto", ["--config", "demo-kto"], tmp_path / "out")
        assert line.startswith(f"config file not found: 'demo-kto' (relative paths start at {cwd}); built-in configs: "
                               "demo, demo-chat, demo-dpo") and line.endswith(tail)


def test_model_that_leaks_under_padding_free(tmp_path, data_dir, demo_tokenizer):
    """A tiny random OPT: its sdpa mask ignores position_ids, so packed examples leak."""
    sizes = dict(hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=2, word_embed_proj_dim=32,
                 max_position_embeddings=512)
    leaky_model = save_tiny_model(tmp_path / "opt", "opt", sizes, demo_tokenizer)
    argv = demo_argv(data_dir, tmp_path / "out", "--model_name_or_path", str(leaky_model), "--attn_implementation", "sdpa")
    message = assert_refused_in_one_line("sft", argv, tmp_path / "out")
    assert message.startswith("padding-free training is unsafe for this model: LEAKS: opt (attn_implementation='sdpa'")
    assert "padfree" in message  # the advice names the fix


_ANOTHER = "unknown option '--{}' on the command line (a field of trl-padfree {}, not of trl-padfree {})"
#: The trainers' own refusals, each a row through the command on the demo pairs: (recipe, --field value, message).
TRAINER_REFUSALS = [
    ("sft", ("--prompt_once", "true"), _ANOTHER.format("prompt_once", "dpo", "train")),
    ("dpo", ("--template", "x"), _ANOTHER.format("template", "train", "dpo")),
    ("dpo", ("--beta", "0"), "beta must be greater than 0, got 0"),
    ("reward", ("--learning_rat", "1e-3"), "unknown option '--learning_rat' on the command line; did you mean "
                                           "'learning_rate'?"),
    ("reward", ("--response_template", "x"), _ANOTHER.format("response_template", "train", "reward")),
    ("reward", ("--scored_lm_head", "false"), _ANOTHER.format("scored_lm_head", "train", "reward")),
    ("reward", ("--center_rewards_coefficient", "-1"), "center_rewards_coefficient must be at least 0"),
    ("kto", ("--desirable_weigth", "1.0"), "unknown option '--desirable_weigth' on the command line; did you mean "
                                           "'desirable_weight'?"),
    ("kto", ("--desirable_weight", "0"), "desirable_weight must be greater than 0"),
    ("grpo", ("--reward_func", "x"), "unknown option '--reward_func' on the command line; did you mean "
                                     "'reward_funcs'?"),
    ("grpo", ("--template", "{prompt}"), _ANOTHER.format("template", "train", "grpo")),
    ("grpo", ("--reward_funcs", "no_such_reward"), "reward_funcs: 'no_such_reward' is not a known reward "
     "(answer_chars, answer_overlap, answer_prefix, exact_match, accuracy_reward, get_soft_overlong_punishment, "
     "reasoning_accuracy_reward, think_format_reward) nor an import path 'module:function'"),
    ("grpo", ("--reward_funcs", "no_such_module:score"), "reward_funcs: cannot import 'no_such_module:score': No "
                                                         "module named 'no_such_module'"),
    ("rloo", ("--reward_funcs", "trl_padfree.rewards:nothing"), "module 'trl_padfree.rewards' has no attribute "
                                                                "'nothing'"),
    ("grpo", ("--reward_funcs", "trl_padfree.rewards:REWARDS"), "is a dict, not a function"),
    ("rloo", ("--beta", "-0.1"), "beta must be at least 0"),
    ("kto", ("--attn_implementation", "sdpaa"), "; did you mean 'sdpa'?"),
    ("dpo", ("--report_to", "wandbb"), "; did you mean 'wandb'?"),
    *[(task, ("--attn_implementation", "sdpa"), "prompt_once: true needs attn_implementation 'padfree'")
      for task in ("dpo", "kto", "reward", "grpo")],
    *[(task, ("--padding_free", "false"), f"{config}(prompt_once=True) needs padding_free=True")
      for task, config in (("dpo", "DPOConfig"), ("kto", "KTOConfig"), ("reward", "RewardConfig"),
                           ("rloo", "RLOOConfig"))],
]


@pytest.mark.parametrize(("task", "extra", "message"), TRAINER_REFUSALS)
def test_a_trainers_bad_setting_is_one_line_before_the_model_loads(tmp_path, task, extra, message):
    config = DEMO_YAML if task == "sft" else CONFIGS / f"demo-{'grpo' if task == 'rloo' else task}.yaml"
    argv = demo_pairs_argv(config, tmp_path / "out", *extra)
    assert message in assert_refused_in_one_line(task, argv, tmp_path / "out", before_model=True)


@pytest.mark.parametrize("task", ["sft", "dpo", "grpo", "rloo", "reward", "kto"])
def test_every_field_of_the_config_class_is_a_key(task):
    """``trl-padfree TASK --config`` takes every field of this package's config class of the trainer."""
    keys = {a.dest for a in build_parser(task)._actions}
    assert {f.name for f in dataclasses.fields(argument_classes(task)[1]) if f.init} <= keys
    assert {"padding_free", "check_packing", "torch_num_threads"} <= keys


# ------------------------------------------------------------------------------------------- resolution


def test_demo_config_resolves(data_dir, tmp_path):
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--learning_rate", "5e-4", "--report_to", "all",
                                "--save_strategy", "no", "--save_steps", "0"))  # (an interval only under its strategy)
    assert cfg.padding_free is True and cfg.training.padding_free is True
    assert cfg.attn_implementation == ("padfree" if not torch.cuda.is_available() else cfg.attn_implementation)
    assert cfg.training.learning_rate == 5e-4  # the command line wins over the file (3e-3)
    assert cfg.training.max_steps == 2 and cfg.training.response_template == "### Answer:"
    assert cfg.launch.template == "### Question: {instruction}\n### Answer: {output}"
    assert not (tmp_path / "out").exists()
    cfg = load_config(demo_argv(data_dir, tmp_path / "out", "--padding_free", "false"))
    assert cfg.padding_free is False and cfg.training.padding_free is False


def test_chat_demo_config_resolves(tmp_path, in_root):  # the demo configs name their files relative to the root
    cfg = load_config(["--config", str(CONFIGS / "demo-chat.yaml"), "--output_dir", str(tmp_path / "out")])
    assert cfg.training.instruction_template is None and cfg.training.response_template is None  # chat masks
    assert cfg.launch.train_file == "trl_padfree/demo/data/chat_train.jsonl" and cfg.launch.template is None
    assert cfg.training.torch_num_threads == 1


@pytest.mark.parametrize(("name", "attn", "peft", "data"), [
    ("llama3-8b-flash.yaml", "flash_attention_2", False, "HuggingFaceH4/ultrachat_200k"),
    ("mistral-7b-lora.yaml", "auto", True, "tatsu-lab/alpaca")])
def test_real_model_configs_parse_and_resolve(name, attn, peft, data):
    """Every key and type as in a run, nothing loaded; ``use_cpu`` as SFTConfig refuses bf16 without a GPU."""
    cfg = load_config(["--config", str(CONFIGS / name), "--use_cpu", "true"], check_environment=False)
    assert (cfg.attn_implementation, cfg.model.use_peft, cfg.launch.dataset_name) == (attn, peft, data)
    assert cfg.model.dtype == "bfloat16" and cfg.training.bf16 is True and cfg.training.gradient_checkpointing is True
    assert cfg.padding_free is True and cfg.training.padding_free is True
    if peft:
        assert cfg.model.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        assert cfg.launch.eval_fraction == 0.02
    else:
        assert cfg.training.instruction_template == ["<|start_header_id|>user<|end_header_id|>\n\n",
                                                     "<|start_header_id|>system<|end_header_id|>\n\n"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the CPU-only message does not apply")
def test_real_model_config_fails_clearly_on_this_machine():
    with pytest.raises(ConfigError, match=r"^invalid settings: Your setup doesn't support bf16/gpu\. You need to assign use_cpu"):
        load_config(["--config", str(CONFIGS / "llama3-8b-flash.yaml")])


@pytest.mark.parametrize(("name", "kind"), [("ddp", DistributedType.MULTI_GPU), ("fsdp", DistributedType.FSDP),
                                           ("deepspeed-zero3", DistributedType.DEEPSPEED),
                                           ("cpu-ddp", DistributedType.MULTI_GPU)])
def test_accelerate_configs_load_with_accelerate(name, kind):
    config = load_config_from_file(str(CONFIGS / "accelerate" / f"{name}.yaml"))
    assert isinstance(config, ClusterConfig) and config.distributed_type == kind and config.num_machines == 1
    if name == "cpu-ddp":  # --cpu and MULTI_CPU would make accelerate start ONE process: this picks torchrun's launcher
        assert config.num_processes == 2 and config.mixed_precision == "no" and not config.use_cpu
        return
    assert config.mixed_precision == "bf16"
    if kind == DistributedType.FSDP:
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    if kind == DistributedType.DEEPSPEED:
        assert config.deepspeed_config["zero_stage"] == 3


def test_env_mapping_sets_variables(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("TRL_PADFREE_TEST_ENV", "before")  # (restored after the test: TRL sets os.environ)
    load_config(demo_argv(data_dir, tmp_path / "out", config=write_yaml(tmp_path / "c.yaml", env={"TRL_PADFREE_TEST_ENV": 7})))
    assert os.environ["TRL_PADFREE_TEST_ENV"] == "7"


@pytest.mark.parametrize(("task", "present", "absent"), [
    ("sft", ("--response_template", "--padding_free", "--template", "--model_name_or_path"), ("--prompt_once",)),
    ("dpo", ("--prompt_once", "--beta", "--chat_template_path"), ("--response_template",)),
    ("grpo", ("--reward_funcs", "--prompt_once", "--num_generations"), ("--response_template",)),
])
def test_help_lists_the_fields_of_the_trainer(capsys, task, present, absent):
    assert main(["--help"], task=task) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: trl-padfree {'train' if task == 'sft' else task} --config configs/NAME.yaml "
                          "[--field value ...]")
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
    assert cfg.training.resume_from_checkpoint == str(out / "checkpoint-4") and cfg.run_id == "r1"
    assert cfg.notes == [
        f"resuming from {out / 'checkpoint-4'} (step 4, the newest complete checkpoint of this run); passed over: "
        "checkpoint-10 (incomplete (no trl-padfree completion marker: the save was interrupted, or another tool "
        "wrote it))"
    ]
    with pytest.raises(ConfigError, match=r"holds no trl-padfree run to resume \(it holds no checkpoint-N directory\)"):
        load_config(demo_argv(data_dir, tmp_path / "empty", "--resume_from_checkpoint", "last"))


def test_real_model_demo_config_resolves():
    """make demo-real's config (SmolLM2-135M, fetched by scripts/real_model.py) resolves; nothing is loaded."""
    assert yaml.safe_load((CONFIGS / "demo-real.yaml").read_text())["model_name_or_path"] == ".cache/smollm2-135m"
    # the checkpoint exists only after scripts/real_model.py fetch: the demo model stands in for it here
    cfg = load_config(["--config", str(CONFIGS / "demo-real.yaml"), "--model_name_or_path", str(DEMO / "model")],
                      check_environment=False)
    assert cfg.task == "sft" and cfg.padding_free is True and cfg.attn_implementation == "auto"
    assert (ROOT / cfg.launch.train_file).is_file() and (ROOT / cfg.launch.eval_file).is_file()


@pytest.mark.parametrize(("config", "task", "owner"), [("demo-kto", "sft", "kto"), ("demo-kto", "dpo", "kto"),
                                                       ("demo-dpo", "sft", "dpo")])
def test_a_config_of_another_trainer_names_the_trainer_that_takes_all_its_keys(config, task, owner):
    """(prompt_once, the first unknown key of demo-kto's, is a field of dpo too: the hint names kto, not dpo.)"""
    with pytest.raises(ConfigError, match=rf"\(a field of trl-padfree {owner}, not of trl-padfree "):
        load_config(["--config", str(CONFIGS / f"{config}.yaml")], task=task)
