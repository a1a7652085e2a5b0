"""The launch builds the training collator with the config's collator settings (padding-free included)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from trl_padfree.launch import load_config
from trl_padfree.launch.model import make_collator_factory

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "trl_padfree" / "demo"


@pytest.mark.parametrize("padding_free", [True, False])
def test_pad_to_multiple_of_reaches_the_training_collator(tmp_path, padding_free):
    cfg = load_config([
        "--config", str(ROOT / "configs" / "demo.yaml"),
        "--model_name_or_path", str(DEMO / "model"),
        "--train_file", str(DEMO / "data" / "train.jsonl"),
        "--eval_file", str(DEMO / "data" / "eval.jsonl"),
        "--output_dir", str(tmp_path / "out"),
        "--padding_free", str(padding_free).lower(),
        "--pad_to_multiple_of", "16",
    ])  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "model")
    collator = make_collator_factory(cfg, tokenizer, padding_free=padding_free, quiet=False)()
    texts = ["### Question: a\n### Answer: b", "### Question: cd\n### Answer: e"]
    batch = collator([tokenizer(t) for t in texts])
    n = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    assert batch["input_ids"].shape[-1] % 16 == 0
    if padding_free:  # the padding is a segment of its own, never trained
        padded = -(-n // 16) * 16
        assert batch["input_ids"].shape == (1, padded) and padded > n
        assert batch["cu_seq_lens_q"].tolist()[-2:] == [n, padded]
        assert batch["labels"][0, n:].eq(-100).all() and batch["position_ids"][0, n].item() == 0
