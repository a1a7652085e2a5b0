"""``SFTTrainer(formatting_func=...)`` per example (TRL 1.x) or for batches (TRL 0.10): the blog post's snippet
(``examples/blog_snippet.py``) runs on demo records, labels checked against character-span truth."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json

import pytest
import torch
from datasets import Dataset, load_dataset
from paths import DEMO, DEMO_MODEL, ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig

from trl_padfree import DataCollatorForCompletionOnlyLM, SFTTrainer
from trl_padfree.formatting import BATCHED_LINE, FormattingFunc, formatting_convention

N_RECORDS = 48


@pytest.fixture(scope="module")
def records() -> list[dict]:
    lines = (DEMO / "data" / "train.jsonl").read_text().splitlines()
    return [json.loads(line) for line in itertools.islice(lines, N_RECORDS)]


@pytest.fixture()
def data_file(tmp_path, records) -> str:
    path = tmp_path / "code_alpaca_like.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def run_example(data_file: str, output_dir: str):
    """``examples/blog_snippet.py`` (the blog's snippet) in this process, 2 steps."""
    spec = importlib.util.spec_from_file_location("blog_snippet", ROOT / "examples" / "blog_snippet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(["--max_steps", "2", "--output_dir", output_dir, "--data_file", data_file])


def run_per_example(batched, data_file: str, output_dir: str):
    """The snippet's trainer with a per-example ``formatting_func`` (TRL >= 0.13), all else the same."""
    def formatting_prompts_func_per_example(example):
        return f"### Question: {example['instruction']}\n ### Answer: {example['output']}"

    trainer = SFTTrainer(
        AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32, attn_implementation="padfree"),
        train_dataset=load_dataset("json", data_files=data_file, split="train"),
        args=dataclasses.replace(batched.args, output_dir=output_dir), processing_class=batched.processing_class,
        formatting_func=formatting_prompts_func_per_example, data_collator=batched.data_collator)
    trainer.train()
    return trainer


def expected_labels(tokenizer, record: dict) -> tuple[tuple[int, ...], list[int]]:
    """``(input_ids, labels)`` of one record from characters: every token that starts after "### Answer:" is
    trained, the EOS TRL appends too (pad = eos here: it must still be trained); the first token never is."""
    text = f"### Question: {record['instruction']}\n ### Answer: {record['output']}"
    answer_start = text.index("### Answer:") + len("### Answer:")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = [*enc["input_ids"], tokenizer.eos_token_id]
    starts = [start for start, _ in enc["offset_mapping"]] + [len(text)]
    labels = [tok if start >= answer_start else -100 for tok, start in zip(ids, starts, strict=True)]
    labels[0] = -100
    return tuple(ids), labels


def check_labels(trainer, records) -> int:
    """Every example of the trainer's training batches has the character-span labels; returns how many."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    truth = dict(expected_labels(tokenizer, r) for r in records)
    checked = 0
    for batch in itertools.islice(trainer.get_train_dataloader(), 3):
        ids, labels, pos = batch["input_ids"][0].tolist(), batch["labels"][0].tolist(), batch["position_ids"][0]
        starts = [*torch.nonzero(pos == 0).flatten().tolist(), len(ids)]
        for a, b in itertools.pairwise(starts):
            assert labels[a:b] == truth[tuple(ids[a:b])]
            checked += 1
    return checked


def test_blog_snippet_with_a_batched_or_per_example_formatting_func_trains_the_same_exact_labels(
    data_file, records, tmp_path, capsys
):
    batched = run_example(data_file, str(tmp_path / "a"))
    assert capsys.readouterr().out.count(BATCHED_LINE) == 1
    assert batched.state.global_step == 2
    assert check_labels(batched, records) == 24  # 3 batches of 8
    # the same texts, hence the same tokens, as the per-example form of the same function
    texts = [f"### Question: {r['instruction']}\n ### Answer: {r['output']}" for r in records]
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    assert batched.train_dataset["input_ids"] == [
        [*tokenizer(t, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id] for t in texts
    ]
    per_example = run_per_example(batched, data_file, str(tmp_path / "b"))
    assert BATCHED_LINE not in capsys.readouterr().out  # nothing to say
    assert per_example.train_dataset["input_ids"] == batched.train_dataset["input_ids"]
    assert check_labels(per_example, records) == 24
    losses = [[h[k] for h in t.state.log_history for k in ("loss", "train_loss") if k in h] for t in (batched, per_example)]
    assert losses[0] and all(torch.isfinite(torch.tensor(losses[0]))) and losses[0] == losses[1]


RECORD = {"instruction": "Count from 1 to 3.", "output": "1 2 3"}


def test_conventions_are_told_apart_on_one_record():
    def per_example(ex):
        return ex["instruction"] + ex["output"]

    def batched_zip(batch):  # a batched function that does not fail on one example: returns one text per character
        return [q + a for q, a in zip(batch["instruction"], batch["output"], strict=False)]

    def batched_index(batch):  # the blog's form: on one example, IndexError (output shorter than instruction)
        return [batch["instruction"][i] + batch["output"][i] for i in range(len(batch["instruction"]))]

    assert formatting_convention(per_example, RECORD) == "example"
    assert formatting_convention(batched_zip, RECORD) == "batch"
    assert formatting_convention(batched_index, RECORD) == "batch"
    assert FormattingFunc(batched_zip, announce=False)(RECORD) == per_example(RECORD)
    assert FormattingFunc(batched_index, announce=False)(RECORD) == per_example(RECORD)


BOTH = ("TRL >= 0.13 (1.x) calls formatting_func with one example", "TRL 0.10 called it with a batch")


@pytest.mark.parametrize("func, error, shown", [
    (lambda ex: None, TypeError, "returned None when called with one example, and returned None when called"),
    (lambda ex: {"text": "x"}, TypeError, "returned {'text': 'x'} when called with one example"),
    (lambda ex: ["one text"], TypeError, "returned ['one text'] when called with one example, and returned "
                                         "['one text'] when called with a batch"),
    (lambda ex: ex["missing"], ValueError, "raised KeyError: 'missing' when called with one example, and "
                                           "raised KeyError: 'missing' when called with a batch"),
])
def test_what_cannot_be_told_is_refused_naming_both_conventions(func, error, shown):
    with pytest.raises(error) as info:
        formatting_convention(func, RECORD)
    message = str(info.value)
    assert message.startswith("formatting_func: cannot tell how it is written (")
    assert all(part in message for part in BOTH) and shown in message
    assert message.endswith("Make it return one string for one example (or a list of strings, one per record, "
                            "for a batch)")


def test_a_later_record_returning_something_else_is_refused():
    func = FormattingFunc(lambda ex: ex["output"] if ex["output"] != "oops" else 7, announce=False)
    assert func(RECORD) == "1 2 3"
    with pytest.raises(TypeError, match=r"^formatting_func returned 7 for one example; it must return one string"):
        func({**RECORD, "output": "oops"})
    batched = FormattingFunc(lambda b: [] if b["output"] == ["oops"] else list(b["output"]), announce=False)
    assert batched(RECORD) == "1 2 3" and batched.convention == "batch"
    with pytest.raises(TypeError, match=r"^formatting_func \(written for batches\) returned \[\] for a batch of one"):
        batched({**RECORD, "output": "oops"})


def test_trainer_refuses_what_it_cannot_tell_before_any_work_and_never_calls_it_on_tokens(data_file, tmp_path):
    """A function it cannot tell is refused before anything is written; for a dataset with ``input_ids`` TRL ignores
    ``formatting_func`` (with a warning): nothing told or refused."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    args = SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(TypeError, match=r"^formatting_func: cannot tell how it is written \(TRL >= 0.13"):
        SFTTrainer(model, train_dataset=load_dataset("json", data_files=data_file, split="train"), args=args,
                   processing_class=tokenizer, formatting_func=lambda ex: 0,
                   data_collator=DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tokenizer, padding_free=True))
    assert not (tmp_path / "out").exists()
    calls = []
    SFTTrainer(model, train_dataset=Dataset.from_dict({"input_ids": [[5, 6, 7, 8]] * 4}), args=args,
               processing_class=tokenizer, formatting_func=lambda ex: calls.append(ex) or 0)
    assert calls == []
