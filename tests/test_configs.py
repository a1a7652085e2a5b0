"""trl_padfree's config classes (trl_padfree/configs.py): TRL's configs with this package's fields, read by its
trainers, parsed by ``trl.TrlParser``; the former trainer keywords as deprecated aliases."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import trl
from tiny_sft import tokenized_dataset

import trl_padfree
from trl_padfree import DataCollatorForCompletionOnlyLM, PackingCheckCallback, SFTTrainer
from trl_padfree.configs import UNSET, trainer_settings
from trl_padfree.testing import tiny_llama

CPU = {"output_dir": "unused", "report_to": "none", "bf16": False, "use_cpu": True}

#: every config of the package: its fields and their defaults
SHARED = {"padding_free": False, "check_packing": True, "torch_num_threads": "auto"}
FIELDS = {"SFTConfig": SHARED | {"response_template": None, "instruction_template": None, "max_tokens_per_batch": None,
                                 "scored_lm_head": True},
          **{name: SHARED | {"prompt_once": False, "scored_lm_head": True}
             for name in ("DPOConfig", "GRPOConfig", "RLOOConfig", "KTOConfig")},
          "RewardConfig": SHARED | {"prompt_once": False}}


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_each_config_is_trls_with_the_packages_fields_and_trl_parser_reads_them(name):
    cls = getattr(trl_padfree, name)
    assert issubclass(cls, getattr(trl, name)) and cls.__name__ == name
    config = cls(**CPU)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for field_name, default in FIELDS[name].items():
        assert getattr(config, field_name) == default, field_name
        assert fields[field_name].metadata["help"], field_name  # documented as TRL's fields are
    assert "scored_lm_head" in fields or name == "RewardConfig"
    trl_fields = {f.name for f in dataclasses.fields(getattr(trl, name))}
    assert trl_fields <= set(fields)  # nothing of TRL's lost
    if name == "SFTConfig":  # (its fields: test_trl_parser_reads_every_field_from_yaml_and_the_command_line)
        return
    (config,) = trl.TrlParser((cls,)).parse_args_and_config(
        ["--output_dir", "out", "--report_to", "none", "--bf16", "false", "--padding_free", "true",
         "--prompt_once", "true", "--check_packing", "false", "--torch_num_threads", "none"])
    assert type(config) is cls
    assert (config.padding_free, config.prompt_once, config.check_packing, config.torch_num_threads) == (
        True, True, False, None)


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt_once": True}, "DPOConfig(prompt_once=True) needs padding_free=True"),
    ({"torch_num_threads": 0}, "torch_num_threads must be 'auto', a positive integer or None, got 0"),
    ({"torch_num_threads": "0"}, "torch_num_threads must be 'auto', a positive integer or None, got 0"),  # YAML/CLI
    ({"torch_num_threads": "many"}, "torch_num_threads must be 'auto', a positive integer or None, got 'many'"),
    ({"check_packing": "yes"}, "DPOConfig(check_packing='yes'): check_packing must be True or False"),
])
def test_config_errors_name_the_fix(kwargs, message):
    with pytest.raises(ValueError) as info:
        trl_padfree.DPOConfig(**CPU, **kwargs)
    assert message in str(info.value)


def test_sft_config_errors_and_text_values():
    with pytest.raises(ValueError, match=r"SFTConfig\(padding_free=True, packing=True\).*set packing=False"):
        trl_padfree.SFTConfig(**CPU, padding_free=True, packing=True)
    with pytest.raises(ValueError, match=r"SFTConfig\(max_tokens_per_batch=-5\): give a positive number"):
        trl_padfree.SFTConfig(**CPU, max_tokens_per_batch=-5)
    config = trl_padfree.SFTConfig(**CPU, torch_num_threads="3", max_tokens_per_batch="256",
                                   instruction_template="### Question:")
    assert (config.torch_num_threads, config.max_tokens_per_batch) == (3, 256)
    assert config.instruction_template == ["### Question:"]
    assert trl_padfree.GRPOConfig(**CPU, torch_num_threads="null").torch_num_threads is None


def test_trl_parser_reads_every_field_from_yaml_and_the_command_line(tmp_path):
    yaml_file = tmp_path / "sft.yaml"
    yaml_file.write_text(
        "output_dir: out\nreport_to: none\nbf16: false\nuse_cpu: true\nlearning_rate: 0.0003\nmax_length: 512\n"
        "padding_free: true\nresponse_template: '### Answer:'\ninstruction_template: ['### Question:', '### System:']\n"
        "max_tokens_per_batch: 4096\ntorch_num_threads: 2\ncheck_packing: false\nscored_lm_head: false\n")
    (config,) = trl.TrlParser((trl_padfree.SFTConfig,)).parse_args_and_config(["--config", str(yaml_file)])
    assert type(config) is trl_padfree.SFTConfig
    assert (config.padding_free, config.response_template, config.instruction_template) == (
        True, "### Answer:", ["### Question:", "### System:"])
    assert (config.max_tokens_per_batch, config.torch_num_threads) == (4096, 2)
    assert (config.check_packing, config.scored_lm_head) == (False, False)
    assert (config.learning_rate, config.max_length, config.output_dir) == (0.0003, 512, "out")
    # the command line overrides the file, with its text turned into the field's type
    (config,) = trl.TrlParser((trl_padfree.SFTConfig,)).parse_args_and_config(
        ["--config", str(yaml_file), "--torch_num_threads", "4", "--max_tokens_per_batch", "1024",
         "--check_packing", "true", "--response_template", "### Reply:"])
    assert (config.torch_num_threads, config.max_tokens_per_batch, config.check_packing) == (4, 1024, True)
    assert config.response_template == "### Reply:" and config.padding_free is True


@pytest.fixture(scope="module")
def sft_setup(tok):
    return tok, tokenized_dataset(tok, 12)


def _sft_args(cls, tmp_path, **fields):
    return cls(**{**CPU, "output_dir": str(tmp_path)}, per_device_train_batch_size=4, max_steps=1, seed=0,
               max_length=256, dataset_kwargs={"skip_prepare_dataset": True}, disable_tqdm=True,
               dataloader_pin_memory=False, activation_checkpointing=False, **fields)


def _sft(sft_setup, args, **kwargs) -> SFTTrainer:
    tok, data = sft_setup
    return SFTTrainer(tiny_llama(vocab_size=len(tok), attn_implementation="padfree"), args=args, train_dataset=data,
                      processing_class=tok, **kwargs)


def _batches(trainer):
    return [{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
            for batch in trainer.get_train_dataloader()]


def test_sft_config_builds_the_collator_the_old_call_built_and_the_trainer_reads_its_fields(sft_setup, tmp_path):
    tok, _ = sft_setup
    old_collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    old = _sft(sft_setup, _sft_args(trl.SFTConfig, tmp_path, padding_free=False), data_collator=old_collator)
    config = _sft_args(trl_padfree.SFTConfig, tmp_path, padding_free=True, response_template="### Answer:")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the config alone: no deprecated keyword
        new = _sft(sft_setup, config)
    collator = new.data_collator
    assert type(collator) is DataCollatorForCompletionOnlyLM and collator.padding_free is True
    assert (collator.response_template, collator.instruction_template, collator.tokenizer) == (
        "### Answer:", None, tok)
    assert config.padding_free is True and new.padding_free is False  # (TRL's own mode stayed off)
    got, want = _batches(new), _batches(old)
    assert len(got) == 3 and got == want  # every flat row, label, position and boundary alike
    assert "cu_seq_lens_q" in got[0] and len(got[0]["input_ids"]) == 1
    for trainer in (old, new):
        assert sum(isinstance(c, PackingCheckCallback) for c in trainer.callback_handler.callbacks) == 1
    # every field read from the config
    trainer = _sft(sft_setup, _sft_args(trl_padfree.SFTConfig, tmp_path, padding_free=True, scored_lm_head=False,
                                        response_template="### Answer:", max_tokens_per_batch=64, torch_num_threads=1,
                                        check_packing=False))
    assert (trainer.max_tokens_per_batch, trainer.torch_num_threads, trainer.scored_lm_head) == (64, 1, False)
    assert not any(isinstance(c, PackingCheckCallback) for c in trainer.callback_handler.callbacks)
    rows = _batches(trainer)
    assert all(len(row["input_ids"][0]) <= 64 for row in rows) and len(rows) > 3  # token-budget batches
    # TRL's plain config: the defaults of today
    plain = _sft(sft_setup, _sft_args(trl.SFTConfig, tmp_path),
                 data_collator=DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok))
    assert (plain.max_tokens_per_batch, plain.torch_num_threads, plain.scored_lm_head) == (None, "auto", True)


def test_sft_deprecated_keyword_warns_and_still_works_and_conflicts_name_both(sft_setup, tmp_path):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=sft_setup[0], padding_free=True)
    with pytest.warns(DeprecationWarning, match=r"SFTTrainer\(check_packing=\.\.\.\) is deprecated .* set "
                      r"check_packing in trl_padfree\.SFTConfig\(check_packing=\.\.\.\)") as record:
        trainer = _sft(sft_setup, _sft_args(trl.SFTConfig, tmp_path), data_collator=collator, check_packing=False,
                       max_tokens_per_batch=64)
    assert not any(isinstance(c, PackingCheckCallback) for c in trainer.callback_handler.callbacks)
    assert trainer.max_tokens_per_batch == 64
    deprecations = [w for w in record if issubclass(w.category, DeprecationWarning) and "deprecated" in str(w.message)]
    assert len(deprecations) == 2 and all(w.filename == __file__ for w in deprecations)  # shown at the caller's line
    # a keyword and the config both set: the conflict names both
    config = _sft_args(trl_padfree.SFTConfig, tmp_path, padding_free=True, response_template="### Answer:",
                       check_packing=False)
    with pytest.raises(ValueError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _sft(sft_setup, config, check_packing=True)
    assert str(info.value) == ("SFTTrainer(check_packing=True) conflicts with SFTConfig(check_packing=False): set "
                               "check_packing once, in SFTConfig (the trainer keyword is deprecated)")
    padded = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=sft_setup[0])
    with pytest.raises(ValueError, match=r"SFTConfig\(padding_free=True\) conflicts with "
                       r"data_collator=DataCollatorForCompletionOnlyLM, which does not flatten"):
        _sft(sft_setup, _sft_args(trl_padfree.SFTConfig, tmp_path, padding_free=True), data_collator=padded)
    with pytest.raises(ValueError, match=r"SFTConfig\(response_template=\.\.\., instruction_template=\.\.\.\) "
                       "build the collator, and a data_collator was passed too"):
        _sft(sft_setup, config, data_collator=padded)
    # a default value in the config is not a conflict: the (deprecated) keyword decides
    with pytest.warns(DeprecationWarning):
        trainer = _sft(sft_setup, _sft_args(trl_padfree.SFTConfig, tmp_path, response_template="### Answer:"),
                       scored_lm_head=False)
    assert trainer.scored_lm_head is False and trainer.data_collator.padding_free is False


def test_trainer_settings_of_every_trainer():
    for trainer, config_name in (("DPOTrainer", "DPOConfig"), ("GRPOTrainer", "GRPOConfig"),
                                 ("RLOOTrainer", "RLOOConfig"), ("KTOTrainer", "KTOConfig"),
                                 ("RewardTrainer", "RewardConfig")):
        config = getattr(trl_padfree, config_name)(**CPU, padding_free=True, prompt_once=True,
                                                   torch_num_threads=2)
        assert trainer_settings(trainer, config, prompt_once=UNSET, torch_num_threads=UNSET) == {
            "prompt_once": True, "torch_num_threads": 2}
        plain = getattr(trl, config_name)(**CPU)  # TRL's config: the defaults
        assert trainer_settings(trainer, plain, prompt_once=UNSET, check_packing=UNSET) == {
            "prompt_once": False, "check_packing": True}
        with pytest.warns(DeprecationWarning, match=rf"{trainer}\(prompt_once=\.\.\.\) is deprecated .* "
                          rf"trl_padfree\.{config_name}\(prompt_once=\.\.\.\)"):
            assert trainer_settings(trainer, plain, prompt_once=True) == {"prompt_once": True}
        with pytest.raises(ValueError, match=rf"^{trainer}\(torch_num_threads=4\) conflicts with {config_name}\("
                           r"torch_num_threads=2\)"), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            trainer_settings(trainer, config, torch_num_threads=4)


def test_dpo_trainer_reads_prompt_once_and_check_packing_from_its_config(tmp_path):
    from tiny_dpo import pairs, tokenizer
    from tiny_dpo import trainer as dpo_trainer

    tok = tokenizer()
    config = trl_padfree.DPOConfig(**{**CPU, "output_dir": str(tmp_path)}, padding_free=True, prompt_once=True,
                                   check_packing=False, max_length=None, per_device_train_batch_size=4)
    trainer = trl_padfree.DPOTrainer(tiny_llama(attn_implementation="padfree"),
                                     tiny_llama(seed=1, attn_implementation="padfree"), args=config,
                                     train_dataset=pairs(8), processing_class=tok)
    assert trainer.padfree and trainer.prompt_once and trainer.data_collator.prompt_once
    assert not any(isinstance(c, PackingCheckCallback) for c in trainer.callback_handler.callbacks)
    assert config.padding_free is True  # (given back after TRL's __init__)
    with pytest.warns(DeprecationWarning, match=r"DPOTrainer\(prompt_once=\.\.\.\) is deprecated"):
        old = dpo_trainer("once", pairs(8), tok, str(tmp_path))  # the keyword, on TRL's DPOConfig
    assert old.prompt_once and old.data_collator.prompt_once


def test_grpo_trainer_reads_padding_free_from_its_config(tmp_path):
    from tiny_rl import COMMON, model_path, prompts, reward_letters
    from tiny_rl import tokenizer as rl_tokenizer

    init = {"attn_implementation": "padfree", "dtype": "float32"}
    config = trl_padfree.GRPOConfig(output_dir=str(tmp_path), model_init_kwargs=init, **COMMON, padding_free=True,
                                    prompt_once=True, check_packing=False, scored_lm_head=False)
    trainer = trl_padfree.GRPOTrainer(model_path(), reward_funcs=reward_letters, args=config,
                                      train_dataset=prompts(), processing_class=rl_tokenizer())
    assert (trainer.padfree, trainer.prompt_once, trainer.scored_lm_head) == (True, True, False)
    assert trainer.lm_head_state == "trl: scored_lm_head=False"
    with pytest.raises(ValueError, match=r"GRPOTrainer\(padding_free=False\) conflicts with "
                       r"GRPOConfig\(padding_free=True\)"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        trl_padfree.GRPOTrainer(model_path(), reward_funcs=reward_letters, args=config, train_dataset=prompts(),
                                processing_class=rl_tokenizer(), padding_free=False)
