"""The launch builds the training collator with the config's collator settings (padding-free included)."""

from __future__ import annotations

import pytest
from paths import CONFIGS, DEMO, DEMO_MODEL

from trl_padfree.launch import load_config
from trl_padfree.launch.tasks.sft_data import training_collator


@pytest.mark.parametrize("padding_free", [True, False])
def test_pad_to_multiple_of_reaches_the_training_collator(tmp_path, padding_free, demo_tokenizer):
    cfg = load_config([
        "--config", str(CONFIGS / "demo.yaml"),
        "--model_name_or_path", str(DEMO_MODEL),
        "--train_file", str(DEMO / "data" / "train.jsonl"),
        "--eval_file", str(DEMO / "data" / "eval.jsonl"),
        "--output_dir", str(tmp_path / "out"),
        "--padding_free", str(padding_free).lower(),
        "--pad_to_multiple_of", "16",
    ])  # fmt: skip
    collator = training_collator(cfg, demo_tokenizer)
    texts = ["### Question: a\n### Answer: b", "### Question: cd\n### Answer: e"]
    batch = collator([demo_tokenizer(t) for t in texts])
    n = sum(len(demo_tokenizer(t)["input_ids"]) for t in texts)
    assert batch["input_ids"].shape[-1] % 16 == 0
    if padding_free:  # the padding is a segment of its own, never trained
        padded = -(-n // 16) * 16
        assert batch["input_ids"].shape == (1, padded) and padded > n
        assert batch["cu_seq_lens_q"].tolist()[-2:] == [n, padded]
        assert batch["labels"][0, n:].eq(-100).all() and batch["position_ids"][0, n].item() == 0


def test_chat_demo_trains_exactly_the_assistant_turns_of_its_chat_template(tmp_path, in_root, demo_tokenizer):
    """configs/demo-chat.yaml labels from the chat template: every answer and its <|eos|>, not the "\\n" after it."""
    import json

    from trl_padfree.launch.tasks.sft_data import prepare_data

    cfg = load_config(["--config", str(CONFIGS / "demo-chat.yaml"), "--output_dir", str(tmp_path / "out"),
                       "--max_train_examples", "16"])  # fmt: skip
    data = prepare_data(cfg, demo_tokenizer)
    rows = [json.loads(line) for line in (DEMO / "data" / "chat_train.jsonl").read_text().splitlines()[:16]]
    assert len(data.train) == 16
    for example, row in zip(data.train, rows, strict=True):
        want = demo_tokenizer.apply_chat_template(row["messages"], return_dict=True, return_assistant_tokens_mask=True)
        assert example["input_ids"] == want["input_ids"]
        trained = [lab != -100 for lab in example["labels"]]
        assert trained == [bool(m) for m in want["assistant_masks"]]
        answers = "".join(f" {m['content']}<|eos|>" for m in row["messages"] if m["role"] == "assistant")
        assert demo_tokenizer.decode([t for t in example["labels"] if t != -100]) == answers


@pytest.mark.parametrize("word", ["null", "None"])
def test_null_on_the_command_line_unsets_the_templates(tmp_path, in_root, word):
    base = ["--config", str(CONFIGS / "demo-chat.yaml"), "--output_dir", str(tmp_path / "out")]
    cfg = load_config([*base, "--response_template", "### Answer:", "--instruction_template", word])
    assert cfg.training.response_template == "### Answer:" and cfg.training.instruction_template is None
    cfg = load_config([*base, "--response_template", word, "--instruction_template", word])
    assert cfg.training.response_template is None and cfg.training.instruction_template is None


@pytest.mark.parametrize("pad_to_multiple_of", [None, 16])
def test_token_counts_of_a_flattened_batch_come_from_its_shape_and_max_length(pad_to_multiple_of, demo_tokenizer):
    """The launch's SFT trainer counts a flattened batch's tokens without reading cu_seq_lens_q (a device sync every step):
    the same counts as from the boundaries themselves, padding segment included."""
    from trl_padfree import DataCollatorForCompletionOnlyLM
    from trl_padfree.throughput import batch_token_counts

    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=demo_tokenizer, padding_free=True,
                                               pad_to_multiple_of=pad_to_multiple_of)
    texts = ["### Question: a\n### Answer: b", "### Question: cdef gh\n### Answer: e", "### Question: x\n### Answer: yz"]
    batch = collator([demo_tokenizer(t) for t in texts])
    assert isinstance(batch["max_length_q"], int)
    from_boundaries = batch_token_counts({k: v for k, v in batch.items() if k != "max_length_q"})
    assert batch_token_counts(batch) == from_boundaries
    assert from_boundaries[1] > from_boundaries[0]
