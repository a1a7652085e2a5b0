"""A practitioner's first hour (issue 10): the launch's defaults, quiet runs, prompt/completion data without a
response template, ``check``'s options, saved configs with ``use_cache: true``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from launch_runs import write_jsonl
from paths import DEMO, ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer, OPTConfig, OPTForCausalLM
from transformers.trainer_callback import ProgressCallback
from trl import SFTConfig

from trl_padfree import DataCollatorForCompletionOnlyLM, SFTTrainer
from trl_padfree.launch import ConfigError, load_config
from trl_padfree.launch.defaults import ModelShape, apply_defaults, model_shape
from trl_padfree.launch.tasks.sft_data import prepare_data
from trl_padfree.probe import PackingLeakError
from trl_padfree.testing import tiny_llama

#: prompt/completion records (TRL's standard format) and their exact tokens under the demo tokenizer.
PROMPT_COMPLETION = [{"prompt": "Q: red?\nA:", "completion": " RED"}, {"prompt": "Q: cat dog?\nA:", "completion": " CAT DOG"}]


def test_a_run_of_an_own_minimal_config_is_quiet_and_picks_defaults_for_this_machine(tmp_path):
    """``trl-padfree train`` in its own process (no tuning keys, 3 steps), output into pipes, no OMP_NUM_THREADS."""
    write_jsonl(tmp_path / "train.jsonl", PROMPT_COMPLETION * 8)
    config = tmp_path / "own.yaml"
    config.write_text(f"model_name_or_path: {DEMO / 'model'}\ntrain_file: {tmp_path / 'train.jsonl'}\noutput_dir: "
                      f"{tmp_path / 'out'}\nmax_steps: 3\nper_device_train_batch_size: 4\nlogging_steps: 1\n"
                      "report_to: none\nsave_strategy: 'no'\n", encoding="utf-8")
    env = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "trl_padfree.cli", "train", "--config", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stderr == ""  # no pin_memory UserWarning, no gradient_checkpointing FutureWarning, no progress bars
    assert "\r" not in proc.stdout and "it/s]" not in proc.stdout
    assert len([line for line in proc.stdout.splitlines() if line.startswith("{'loss'")]) == 3  # one line a step
    assert "(format: prompt+completion)" in proc.stdout and "[trl-padfree] steps: 3/3" in proc.stdout
    assert json.loads((tmp_path / "out" / "config.json").read_text())["use_cache"] is True
    if not torch.cuda.is_available():  # CPU: no activation checkpointing, no bf16, one thread for hidden size 128
        run_line = next(line for line in proc.stdout.splitlines() if line.startswith("[trl-padfree] run: "))
        assert "device=cpu, bf16=False, activation_checkpointing=False, torch_num_threads=1," in run_line


def _own_cfg(tmp_path: Path, *extra: str, rows: list[dict] = PROMPT_COMPLETION):
    """A config of no file: the demo model, ``rows`` as train_file."""
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    return load_config(["--model_name_or_path", str(DEMO / "model"), "--train_file", str(train),
                        "--output_dir", str(tmp_path / "out"), *extra], check_environment=False)  # fmt: skip


def test_prompt_completion_labels_without_response_template(demo_tokenizer, tmp_path):
    """The prompt is masked as it is, the completion and EOS trained, the collator only flattens."""
    cfg = _own_cfg(tmp_path)
    assert cfg.training.response_template is None
    data = prepare_data(cfg, demo_tokenizer)
    assert data.text_format == "prompt+completion" and data.template_missing_in_check == 0
    assert data.train["input_ids"] == [[51, 28, 294, 33, 201, 35, 28, 390, 2], [51, 28, 279, 300, 33, 201, 35, 28, 395, 417, 2]]
    assert data.train["labels"] == [
        [-100, -100, -100, -100, -100, -100, -100, 390, 2],  # "Q: red?\nA:" | " RED" <eos>
        [-100, -100, -100, -100, -100, -100, -100, -100, 395, 417, 2],  # "Q: cat dog?\nA:" | " CAT DOG" <eos>
    ]
    assert demo_tokenizer.decode([390, 2]) == " RED<|eos|>"


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        ([{"text": "### Question: a\n### Answer: b"}], [],
         "response_template is missing: set the text that precedes every completion, e.g. '### Answer:' (only "
         "prompt/completion and messages data can do without it; this data is formatted as 'text')"),
        ([{"q": "a", "a": "b"}], ["--template", "Q: {q} A: {a}"],
         "response_template is missing: set the text that precedes every completion, e.g. '### Answer:'"),
    ],
)  # fmt: skip
def test_response_template_still_required_for_other_formats(demo_tokenizer, tmp_path, rows, extra, message):
    with pytest.raises(ConfigError) as err:
        prepare_data(_own_cfg(tmp_path, *extra, rows=rows), demo_tokenizer)
    assert str(err.value) == message


@pytest.mark.parametrize(("device", "parameters", "on"), [
    ("cuda", 7_000_000_000, True), ("cuda", 494_000_000, False), ("cuda", None, False), ("cpu", 7_000_000_000, False)])
def test_activation_checkpointing_is_on_for_a_large_model_on_cuda(tmp_path, device, parameters, on):
    cfg, chosen = apply_defaults(_own_cfg(tmp_path), device, ModelShape(hidden_size=4096, parameters=parameters))
    assert chosen["activation_checkpointing"] is on and cfg.training.activation_checkpointing is on
    assert cfg.training.gradient_checkpointing is on  # TRL reads the old name
    assert cfg.training.dataloader_pin_memory is (device == "cuda")


@pytest.mark.parametrize(("omp", "extra", "chosen", "threads"), [
    (None, ("--activation_checkpointing", "true", "--torch_num_threads", "3", "--dataloader_pin_memory", "true"),
     {"disable_tqdm": True}, 3),  # explicit settings win
    ("2", (), {"activation_checkpointing": False, "disable_tqdm": True, "dataloader_pin_memory": False}, None)])
def test_explicit_settings_and_omp_num_threads_win_over_the_defaults(tmp_path, monkeypatch, omp, extra, chosen, threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if omp:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    cfg, got = apply_defaults(_own_cfg(tmp_path, *extra), "cpu", ModelShape(hidden_size=128, parameters=10))
    assert got == chosen and cfg.training.torch_num_threads == threads
    assert cfg.training.dataloader_pin_memory is bool(extra)


def _tiny_sft(tmp_path: Path, model, **kw) -> SFTTrainer:
    tok = AutoTokenizer.from_pretrained(DEMO / "model")
    ds = Dataset.from_dict({"text": [f"### Question: q{i}\n### Answer: a{i}" for i in range(8)]})
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to=[],
                     save_strategy="no", use_cpu=True, bf16=False, activation_checkpointing=False, **kw)  # fmt: skip
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    return SFTTrainer(model, args=args, train_dataset=ds, processing_class=tok, data_collator=collator)


def test_sft_trainer_logs_the_probe_pass_once_writes_its_card_and_saves_use_cache_true(tmp_path, capsys):
    model = tiny_llama(vocab_size=768, attn_implementation="padfree")
    trainer = _tiny_sft(tmp_path, model)
    trainer.train()
    probe_lines = [line for line in capsys.readouterr().out.splitlines() if "packing probe" in line]
    assert len(probe_lines) == 1
    assert probe_lines[0].startswith("[trl-padfree] packing probe: llama with 'padfree' keeps packed examples apart")
    # save_strategy="no": TRL writes its card only with a checkpoint; the package writes it at the end of training
    assert not any(p.name.startswith("checkpoint-") for p in tmp_path.iterdir())
    card = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "This model is a fine-tuned version of a local model." in card and "[None]" not in card
    assert f'model="{tmp_path}"' in card
    trainer.save_model(str(tmp_path / "saved"))
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["use_cache"] is True
    assert model.config.use_cache is False  # training itself still runs without a cache


def test_a_run_stopped_by_the_probe_leaves_no_progress_bar_open(tmp_path):
    """The stray ``0%| | 0/N`` printed at interpreter exit came from this bar."""
    torch.manual_seed(0)
    opt = OPTForCausalLM(OPTConfig(vocab_size=768, hidden_size=32, ffn_dim=64, num_hidden_layers=1,
                                   num_attention_heads=4, word_embed_proj_dim=32, attn_implementation="sdpa"))  # fmt: skip
    trainer = _tiny_sft(tmp_path, opt, disable_tqdm=False)
    with pytest.raises(PackingLeakError):
        trainer.train()
    bars = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ProgressCallback)]
    assert bars and all(cb.training_bar is None for cb in bars)


def test_model_shape_counts_parameters_without_loading_weights(tmp_path):
    shape = model_shape(_own_cfg(tmp_path), count_parameters=True)
    model = AutoModelForCausalLM.from_pretrained(DEMO / "model")
    assert shape == ModelShape(hidden_size=128, parameters=sum(p.numel() for p in model.parameters()))
