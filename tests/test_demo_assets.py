"""The shipped demo assets (``trl_padfree/demo``) load through the ordinary APIs, as the demo config loads them, and
are what ``scripts/make_demo_assets.py`` makes."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import load_dataset
from paths import DEMO, DEMO_MODEL, ROOT
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM, PreTrainedTokenizerFast

DATA_DIR = DEMO / "data"
SCRIPT = ROOT / "scripts" / "make_demo_assets.py"
DATA_FILES = ("train.jsonl", "eval.jsonl", "chat_train.jsonl", "chat_eval.jsonl", "pref_train.jsonl", "pref_eval.jsonl")


_spec = importlib.util.spec_from_file_location("make_demo_assets", SCRIPT)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


@pytest.fixture(scope="module")
def demo_data():
    return load_dataset("json", data_files={split: str(DATA_DIR / f"{split}.jsonl") for split in ("train", "eval")})


@pytest.fixture(scope="module")
def train_lengths(demo_tokenizer, demo_data) -> np.ndarray:
    """Token count of every formatted training example, EOS included (what the trainer sees)."""
    texts = [gen.format_example(row) for row in demo_data["train"]]
    ids = demo_tokenizer(texts, add_special_tokens=False)["input_ids"]
    return np.array([len(x) + 1 for x in ids])


def test_tokenizer_special_tokens_and_round_trip(demo_tokenizer, demo_data) -> None:
    assert isinstance(demo_tokenizer, PreTrainedTokenizerFast)
    assert len(demo_tokenizer) == gen.VOCAB_SIZE
    assert (demo_tokenizer.pad_token, demo_tokenizer.bos_token, demo_tokenizer.eos_token) == (gen.PAD, gen.BOS, gen.EOS)
    assert (demo_tokenizer.pad_token_id, demo_tokenizer.bos_token_id, demo_tokenizer.eos_token_id) == (0, 1, 2)
    assert demo_tokenizer.padding_side == "right"
    # no special token is added implicitly: the trainer appends EOS itself, and templates match in context
    assert demo_tokenizer("cat dog")["input_ids"] == demo_tokenizer("cat dog", add_special_tokens=False)["input_ids"]
    assert demo_tokenizer.convert_ids_to_tokens(demo_tokenizer("### Answer:")["input_ids"]) == ["###", "ĠAnswer", ":"]
    texts = [gen.format_example(row) for split in ("train", "eval") for row in demo_data[split]]
    texts += ["Ünïcode and émoji 🙂 are byte-level: nothing is unknown.\n\ttabs too"]
    encoded = demo_tokenizer(texts)["input_ids"]
    assert [demo_tokenizer.decode(ids) for ids in encoded] == texts
    eos = demo_tokenizer.decode(demo_tokenizer(texts[0] + gen.EOS)["input_ids"])
    assert eos == texts[0] + gen.EOS


def _answer(instruction: str) -> tuple[str, str]:
    """(the task kind, the right answer) of a demo instruction, computed from its text."""
    words = instruction.split(": ", 1)[-1].split()
    ints = [int(x) for x in re.findall(r"\d+", instruction)]
    span = instruction.removesuffix(".").split()[-3::2]
    starts = instruction.startswith
    rules = {
        "reverse": (starts("Reverse the order"), lambda: " ".join(words[::-1])),
        "sort": (starts("Sort the numbers"), lambda: " ".join(map(str, sorted(map(int, words))))),
        "upper": (starts("Write the words in capital"), lambda: " ".join(words).upper()),
        "copy": (starts("Copy the text"), lambda: " ".join(words)),
        "number_words": (starts("Number the words"),
                         lambda: " ".join(f"{i}. {w}" for i, w in enumerate(words, 1)) + f". Count: {len(words)}"),
        "last": (starts("What is the last word?"), lambda: instruction.split()[-1]),
        "first": (starts("What is the first word?"), lambda: instruction.split()[5]),
        "add": (re.fullmatch(r"What is \d+ \+ \d+\?", instruction), lambda: str(ints[0] + ints[1])),
        "count_up": (starts("Count from"), lambda: " ".join(map(str, range(ints[0], ints[1] + 1)))),
        "count_down": (starts("Count down from"), lambda: " ".join(map(str, range(ints[0], ints[1] - 1, -1)))),
        "count_by": (starts("Count by"), lambda: " ".join(map(str, range(ints[1], ints[2] + 1, ints[0])))),
        "times_table": (starts("Write the") and "times table" in instruction,
                        lambda: ", ".join(f"{ints[0]} x {i} = {ints[0] * i}" for i in range(1, ints[1] + 1)) + "."),
        "repeat": (starts("Repeat the word"), lambda: " ".join([instruction.split("'")[1]] * ints[0])),
        "letters": (starts("List the letters"), lambda: " ".join(map(chr, range(ord(span[0]), ord(span[-1]) + 1)))),
    }
    return next(((kind, answer()) for kind, (match, answer) in rules.items() if match), ("unknown", ""))


def test_the_data_answers_every_instruction_correctly_under_one_template(demo_tokenizer, demo_data) -> None:
    """Every output is the right answer to its instruction, all 14 task kinds occur in train and eval, eval
    examples are not copies of training examples; each formatted example holds the response template once, as text
    and as its token ids."""
    assert (demo_data["train"].num_rows, demo_data["eval"].num_rows) == (gen.N_TRAIN, gen.N_EVAL)
    assert not set(demo_data["train"]["instruction"]).intersection(demo_data["eval"]["instruction"])
    response_ids = demo_tokenizer(gen.RESPONSE_TEMPLATE, add_special_tokens=False)["input_ids"]
    for split in ("train", "eval"):
        assert demo_data[split].column_names == ["instruction", "output"]
        kinds = set()
        for row in demo_data[split]:
            kind, answer = _answer(row["instruction"])
            assert row["output"] == answer, (kind, row)
            kinds.add(kind)
            text = gen.format_example(row)
            assert text.count(gen.RESPONSE_TEMPLATE) == 1 and text.startswith(gen.INSTRUCTION_TEMPLATE)
            ids = demo_tokenizer(text, add_special_tokens=False)["input_ids"]
            windows = [ids[i : i + len(response_ids)] for i in range(len(ids) - len(response_ids) + 1)]
            assert windows.count(response_ids) == 1, text
        assert len(kinds) == 14 and "unknown" not in kinds, sorted(kinds)


def test_length_spread_is_flan_like(train_lengths) -> None:
    """Short typical examples and a heavy right tail (mean well above the median), all within the model's range."""
    median, p95, mean = np.median(train_lengths), np.percentile(train_lengths, 95), train_lengths.mean()
    assert 55 <= median <= 80, median
    assert 170 <= p95 <= 280, p95
    assert mean / median > 1.2
    assert train_lengths.min() >= 10
    assert 350 <= train_lengths.max() <= 420
    assert (train_lengths > 300).sum() >= 30  # the tail is populated, not a single outlier


def test_model_loads_is_tiny_and_starts_at_a_uniform_loss(demo_tokenizer, demo_data, train_lengths) -> None:
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL)
    cfg = model.config
    assert isinstance(model, LlamaForCausalLM) and model.dtype == torch.float32
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 128, 4, 2)
    assert cfg.vocab_size == len(demo_tokenizer)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    assert cfg.max_position_embeddings >= train_lengths.max()
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert (DEMO_MODEL / "model.safetensors").is_file()
    total_bytes = sum(p.stat().st_size for p in DEMO.rglob("*") if p.is_file())
    assert total_bytes < 6 * 1024 * 1024, total_bytes  # 5.4 MB with the preference demo pairs (0.6 MB)
    # a fresh random init predicts close to uniformly: its loss is about ln(vocab), the demo's starting point
    model.eval()
    text = gen.format_example(demo_data["eval"][0]) + demo_tokenizer.eos_token
    ids = demo_tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids, use_cache=False)
    assert out.logits.shape == (1, ids.shape[1], len(demo_tokenizer))
    assert abs(out.loss.item() - math.log(len(demo_tokenizer))) < 0.2


def test_chat_data_and_template(demo_tokenizer) -> None:
    rows = [json.loads(line) for line in (DATA_DIR / "chat_train.jsonl").read_text().splitlines()]
    assert len(rows) == gen.N_CHAT_TRAIN
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and 4 <= len(roles) <= 6
    messages = [
        {"role": "user", "content": "Copy the text exactly: cat dog"},
        {"role": "assistant", "content": "cat dog"},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
    ]
    text = demo_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "### Question: Copy the text exactly: cat dog\n### Answer: cat dog<|eos|>\n"
        "### Question: What is 2 + 3?\n### Answer: 5<|eos|>\n"
    )
    prompt = demo_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "### Question: Copy the text exactly: cat dog\n### Answer:"
    out = demo_tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    trained = demo_tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained == " cat dog<|eos|> 5<|eos|>"
    with pytest.raises(Exception, match="only user and assistant roles"):
        demo_tokenizer.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)


def test_generator_is_deterministic(tmp_path: Path) -> None:
    """Re-running the script reproduces the shipped data, tokenizer and model config; the weights too, unless the
    installed transformers differs from the one that made them (its random init may change between versions)."""
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, capture_output=True)
    for name in DATA_FILES:
        assert (tmp_path / "data" / name).read_bytes() == (DATA_DIR / name).read_bytes(), name
    new, old = ({name: json.loads((root / name).read_text()) for name in ("tokenizer.json", "config.json")}
                for root in (tmp_path / "model", DEMO_MODEL))
    for key in ("model", "added_tokens"):  # vocab and merges, special tokens
        assert new["tokenizer.json"][key] == old["tokenizer.json"][key]
    same_version = new["config.json"].pop("transformers_version") == old["config.json"].pop("transformers_version")
    assert new["config.json"] == old["config.json"]
    new_template = (tmp_path / "model" / "chat_template.jinja").read_text()
    assert new_template == (DEMO_MODEL / "chat_template.jinja").read_text()
    if same_version:
        new_w, old_w = load_file(tmp_path / "model" / "model.safetensors"), load_file(DEMO_MODEL / "model.safetensors")
        assert new_w.keys() == old_w.keys() and all(torch.equal(new_w[k], old_w[k]) for k in new_w)
