"""``trl-padfree train`` data pipeline: sources, formats, labels, truncation drops (no model, no training)."""

from __future__ import annotations

import pytest
from launch_runs import write_jsonl
from paths import DEMO_MODEL

from trl_padfree.launch import ConfigError, load_config
from trl_padfree.launch.tasks.sft_data import prepare_data


def prepare(tokenizer, argv: list[str]):
    cfg = load_config(["--model_name_or_path", str(DEMO_MODEL), "--output_dir", "/nonexistent/out", *argv])
    return cfg, prepare_data(cfg, tokenizer)


def trained_text(tokenizer, example: dict) -> str:
    return tokenizer.decode([t for t, lab in zip(example["input_ids"], example["labels"], strict=True) if lab != -100])


QA = [{"instruction": f"Copy the text exactly: cat {i}", "output": f"cat {i}"} for i in range(10)]


@pytest.mark.parametrize(("fmt", "text_format", "row"), [
    *[(fmt, "template", dict) for fmt in ("jsonl", "csv", "parquet", "json")],
    ("jsonl", "prompt+completion",
     lambda r: {"prompt": f"### Question: {r['instruction']}\n### Answer:", "completion": " " + r["output"]}),
    ("jsonl", "text", lambda r: {"text": f"### Question: {r['instruction']}\n### Answer: {r['output']}"}),
])  # fmt: skip
def test_each_format_labels_only_the_answer(demo_tokenizer, tmp_path, fmt, text_format, row):
    from datasets import Dataset

    train = tmp_path / f"train.{fmt}"
    getattr(Dataset.from_list([row(r) for r in QA]), f"to_{fmt.replace('jsonl', 'json')}")(str(train))
    template = ["--template", "### Question: {instruction}\n### Answer: {output}"] if text_format == "template" else []
    _, data = prepare(demo_tokenizer, ["--train_file", str(train), *template, "--response_template", "### Answer:",
                                       "--eval_fraction", "0.2", "--seed", "0"])
    assert data.text_format == text_format
    assert (len(data.train), len(data.eval)) == (8, 2)
    assert data.train.column_names == ["input_ids", "labels"]
    example = data.train[0]
    text = demo_tokenizer.decode(example["input_ids"])
    assert text.startswith("### Question: Copy the text exactly: cat ") and text.endswith(demo_tokenizer.eos_token)
    number = text.split("cat ")[1].split("\n")[0]
    assert trained_text(demo_tokenizer, example) == f" cat {number}{demo_tokenizer.eos_token}"


def test_messages_format_trains_every_assistant_turn(demo_tokenizer, tmp_path):
    conversation = [
        {"role": "user", "content": "Copy: a"}, {"role": "assistant", "content": "a"},
        {"role": "user", "content": "Copy: b"}, {"role": "assistant", "content": "b"},
    ]  # fmt: skip
    train = write_jsonl(tmp_path / "train.jsonl", [{"messages": conversation}] * 3)
    _, data = prepare(demo_tokenizer, [
        "--train_file", str(train), "--response_template", "### Answer:", "--instruction_template", "### Question:",
    ])  # fmt: skip
    assert data.text_format == "messages"
    eos = demo_tokenizer.eos_token
    assert trained_text(demo_tokenizer, data.train[0]).split() == f"a{eos} b{eos}".split()


def test_dataset_directory_with_splits(demo_tokenizer, tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", QA[:6])
    write_jsonl(folder / "test.jsonl", QA[6:])
    _, data = prepare(demo_tokenizer, [
        "--dataset_name", str(folder), "--dataset_test_split", "test", "--response_template", "### Answer:",
        "--template", "### Question: {instruction}\n### Answer: {output}",
    ])  # fmt: skip
    assert (len(data.train), len(data.eval)) == (6, 4)
    with pytest.raises(ConfigError, match=r"^dataset_test_split='validation' is not a split of .*; it has: test, train$"):
        prepare(demo_tokenizer, [
            "--dataset_name", str(folder), "--dataset_test_split", "validation", "--response_template", "x",
        ])  # fmt: skip


def test_truncation_drops_examples_without_trained_tokens(demo_tokenizer, tmp_path):
    long = {"instruction": "Copy the text exactly: " + "red " * 80, "output": "red"}
    train = write_jsonl(tmp_path / "train.jsonl", [*QA[:4], long, QA[4]])
    cfg, data = prepare(demo_tokenizer, [
        "--train_file", str(train), "--template", "### Question: {instruction}\n### Answer: {output}",
        "--response_template", "### Answer:", "--max_length", "32",
    ])  # fmt: skip
    assert data.dropped == {"train": 1} and data.loaded == {"train": 6}
    assert len(data.train) == 5
    assert max(len(x) for x in data.train["input_ids"]) <= 32
