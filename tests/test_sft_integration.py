"""The collator inside TRL 1.x's SFTTrainer and transformers' Trainer: runs, learns, and matches padding exactly."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import OPTConfig, OPTForCausalLM, Trainer, TrainingArguments
from trl import SFTConfig

import trl_padfree
from trl_padfree import DataCollatorForCompletionOnlyLM, SFTTrainer
from trl_padfree.probe import PackingLeakError
from trl_padfree.testing import demo_corpus, tiny_llama


@pytest.fixture(scope="module")
def text_ds():
    return Dataset.from_dict({"text": demo_corpus(48)})


def sft(tok, ds, tmp_path, flat: bool = True, template: str | None = "### Answer:", model=None, **kw) -> SFTTrainer:
    args = SFTConfig(**dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=5e-3,
                            logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, data_seed=0,
                            max_length=256, dataloader_drop_last=True, bf16=False) | kw)
    return SFTTrainer(model or tiny_llama(vocab_size=len(tok)), args=args, train_dataset=ds, processing_class=tok,
                      data_collator=DataCollatorForCompletionOnlyLM(template, tokenizer=tok, padding_free=flat))


def train(tok, ds, tmp_path, padding_free: bool, **kw):
    trainer = sft(tok, ds, tmp_path, padding_free, **kw)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses


def test_sft_text_dataset_learns_and_probe_runs(tok, text_ds, tmp_path):
    trainer, losses = train(tok, text_ds, tmp_path, True, max_steps=12, bf16=True)  # TRL's default, autocast on CPU
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    probe = [c for c in trainer.callback_handler.callbacks if isinstance(c, trl_padfree.PackingCheckCallback)]
    assert probe and probe[0].report.ok
    assert trainer.data_collator.stats.templates_not_found == 0
    assert 0 < trainer.data_collator.stats.padding_share < 1


def test_gradient_checkpointing_same_loss(tok, text_ds, tmp_path):
    _, plain = train(tok, text_ds, tmp_path / "a", True, max_steps=2)
    _, ckpt = train(tok, text_ds, tmp_path / "b", True, max_steps=2, gradient_checkpointing=True)
    assert ckpt == pytest.approx(plain, rel=1e-5)


def test_prompt_completion_dataset_without_template(tok, tmp_path):
    texts = demo_corpus(32)
    prompts = [t.split("### Answer:")[0] + "### Answer:" for t in texts]
    completions = [t.split("### Answer:")[1] for t in texts]
    ds = Dataset.from_dict({"prompt": prompts, "completion": completions})
    trainer = sft(tok, ds, tmp_path, template=None, max_steps=2)
    batch = next(iter(trainer.get_train_dataloader()))
    cu = batch["cu_seq_lens_q"].tolist()
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    for s, e in zip(cu[:-1], cu[1:], strict=True):
        trained = ids[s:e][labels[s:e] != -100].tolist()
        text = tok.decode(trained)
        assert "Answer:" not in text and "Question" not in text
        assert text.strip() and trained[-1] == tok.eos_token_id  # the completion and its EOS are trained
    trainer.train()


def test_plain_transformers_trainer(tok, tmp_path):
    features = [tok(t) for t in demo_corpus(32)]
    ds = Dataset.from_list([{"input_ids": f["input_ids"]} for f in features])
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=8, report_to=[],
                             use_cpu=True, save_strategy="no", logging_steps=1, remove_unused_columns=False)
    trainer = Trainer(model=tiny_llama(vocab_size=len(tok)), args=args, train_dataset=ds, data_collator=collator)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses)


def test_sftconfig_padding_free_conflict_names_the_fix(tok, text_ds, tmp_path):
    with pytest.raises(ValueError, match="Set padding_free=False in SFTConfig"):
        sft(tok, text_ds, tmp_path, padding_free=True, max_steps=1)


def test_leaking_model_stops_training_before_the_first_step(tok, text_ds, tmp_path):
    torch.manual_seed(0)
    opt = OPTForCausalLM(OPTConfig(vocab_size=len(tok), hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=32,
                                   attn_implementation="sdpa"))
    trainer = sft(tok, text_ds, tmp_path, model=opt, max_steps=2)
    with pytest.raises(PackingLeakError, match="opt") as err:
        trainer.train()
    assert "sdpa" in str(err.value) and "padding_free=False" in str(err.value)
    assert trainer.state.global_step == 0


def test_resume_with_tied_embeddings_loads_silently_and_keeps_them_tied(tok, text_ds, tmp_path, caplog):
    """transformers 5.24 warns "missing keys ... ['lm_head.weight']" on every resume of a tied model (it checks only
    ``_keys_to_ignore_on_save``); the key is tied, not missing, so SFTTrainer says nothing and the weights stay tied."""
    import logging

    def trainer(max_steps):
        return sft(tok, text_ds, tmp_path, model=tiny_llama(vocab_size=len(tok), tie_word_embeddings=True),
                   max_steps=max_steps, save_strategy="steps", save_steps=2)

    trainer(2).train()
    resumed = trainer(3)
    with caplog.at_level(logging.WARNING, logger="transformers"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert "missing keys" not in caplog.text
    model = resumed.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert resumed.state.global_step == 3
