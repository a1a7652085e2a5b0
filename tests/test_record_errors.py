"""An error raised while a record is formatted or tokenized (chat templates, format strings, record shapes,
tokenizers) is one line, ``<split> record <index> (counting from 0): <cause>; <fix>``, and exit code 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from launch_runs import assert_refused_in_one_line, write_jsonl
from paths import DEMO_MODEL

BAD_INDEX = ["--template", "### Question: {instruction[8]}\n### Answer: {output}", "--response_template", "### Answer:"]


def refused(command: str, tmp_path: Path, rows: list[dict], *extra: str) -> str:
    """``trl-padfree COMMAND`` on the demo model with ``rows`` as train_file exits 2 with one line, writing nothing;
    returns that line."""
    argv = ["--model_name_or_path", str(DEMO_MODEL), "--train_file", str(write_jsonl(tmp_path / "train.jsonl", rows)),
            "--output_dir", str(tmp_path / "out"), *extra]  # fmt: skip
    if command == "train":
        argv += ["--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    return assert_refused_in_one_line("sft" if command == "train" else command, argv, tmp_path / "out")


def chat(*turns: tuple[str, str], **extra) -> dict:
    return {"messages": [{"role": role, "content": content, **extra.get(role, {})} for role, content in turns]}


def word_level_model(tmp_path: Path) -> Path:
    """The demo model with a word-level tokenizer that has no unknown token: it raises on any word it lacks."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "a", "b", "add", "and", "one", "two"]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(DEMO_MODEL / name, model / name)
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>").save_pretrained(model)
    return model


QA = [{"instruction": "add one and two", "output": "two"}] * 3

# (records of train_file, extra arguments, the record named, what the line says after "(counting from 0): ")
CASES = {
    "chat template raises (labels from the chat template)": (
        [chat(("user", "hi"), ("assistant", "yo")), chat(("system", "be brief"), ("user", "hi"), ("assistant", "yo"))],
        [],
        "train_file record 1",
        "the chat template cannot render it (TemplateError: The demo chat template supports only user and assistant "
        "roles, got system); change the record to what the template accepts, or set chat_template_path to a "
        "template that accepts it",
    ),
    "chat template raises (response_template set)": (
        [chat(("user", "hi"), ("assistant", "yo")), chat(("system", "be brief"), ("user", "hi"), ("assistant", "yo"))],
        ["--response_template", "### Answer:"],
        "train_file record 1",
        "the chat template cannot render it (TemplateError: The demo chat template supports only user and assistant "
        "roles, got system)",
    ),
    "chat template expression raises a Python error": (
        [chat(("user", "hi"), ("assistant", "yo")), chat(("user", "hi"), ("assistant", "yo"), user={"n": "x"})],
        ["--chat_template_path", "TEMPLATE"],
        "train_file record 1",
        'the chat template cannot render it (TypeError: can only concatenate str (not "int") to str)',
    ),
    "format string: index out of range": (
        [{"instruction": "a long question", "output": "b"}, {"instruction": "a long one", "output": "b"},
         {"instruction": "short", "output": "b"}],
        BAD_INDEX,
        "train_file record 2",
        "template '### Question: {instruction[8]}\\n### Answer: {output}' cannot format it (IndexError: string index "
        "out of range); fix the template (fields as {name}, literal braces as {{ and }}) or the record",
    ),
    "format string: bad format spec": (
        QA,
        ["--template", "### Question: {instruction}\n### Answer: {output:d}", "--response_template", "### Answer:"],
        "train_file record 0",
        "template '### Question: {instruction}\\n### Answer: {output:d}' cannot format it (ValueError: Unknown "
        "format code 'd' for object of type 'str')",
    ),
    "format string: missing attribute": (
        QA,
        ["--template", "### Question: {instruction.text}\n### Answer: {output}", "--response_template", "### Answer:"],
        "train_file record 0",
        "cannot format it (AttributeError: 'str' object has no attribute 'text')",
    ),
    "record shape: messages prompt with a text completion": (
        [{"prompt": [{"role": "user", "content": "hi"}], "completion": "yo"}],
        [],
        "train_file record 0",
        "it cannot be turned into text (TypeError: prompt and completion must both be lists of messages (TRL's "
        "conversational prompt/completion) or both be text); fix the record",
    ),
    "tokenizer raises on a word it cannot encode": (
        [{"prompt": "add one and one", "completion": " two"}, {"prompt": "add one and two", "completion": " three"}],
        ["--model_name_or_path", "WORD_LEVEL"],
        "train_file record 1",
        "the tokenizer fails on its text (Exception: WordLevel error: Missing [UNK] token from the vocabulary); fix "
        "the record's text, or use a tokenizer that accepts it (model_name_or_path)",
    ),
}


def resolve(args: list[str], tmp_path: Path) -> list[str]:
    out = []
    for arg in args:
        if arg == "TEMPLATE":
            arg = str(tmp_path / "t.jinja")
            Path(arg).write_text("{% for m in messages %}{{ m['content'] }}{% if m['n'] %}{{ m['n'] + 1 }}{% endif %}"
                                 "{% endfor %}", encoding="utf-8")
        elif arg == "WORD_LEVEL":
            arg = str(word_level_model(tmp_path))
        out.append(arg)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_a_record_that_cannot_be_prepared_is_one_line_naming_it(case, tmp_path):
    rows, extra, record, message = CASES[case]
    line = refused("preview", tmp_path, rows, *resolve(extra, tmp_path))
    assert line.startswith(f"{record} (counting from 0): ") and message in line


def test_the_eval_split_is_named(tmp_path):
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"instruction": "a long question", "output": "b"},
                                                  {"instruction": "short", "output": "b"}])
    line = refused("preview", tmp_path, QA, "--eval_file", str(evals), *BAD_INDEX)
    assert line.startswith("eval_file record 1 (counting from 0): template ")


def test_after_eval_fraction_the_record_is_named_in_file_order(tmp_path):
    rows = [{"instruction": f"a long question {i}", "output": "b"} for i in range(20)]
    rows[13] = {"instruction": "short", "output": "b"}
    line = refused("preview", tmp_path, rows, "--eval_fraction", "0.5", *BAD_INDEX)
    assert line.startswith("train_file record 13 (counting from 0): ")


@pytest.mark.parametrize("template", ["### Question: {instruction\n### Answer: {output}", "### Question: }{output}"])
def test_a_template_that_is_no_format_string_is_refused_before_the_data(template, tmp_path):
    line = refused("preview", tmp_path, QA, "--template", template, "--response_template", "### Answer:")
    assert line.startswith(f"template {template!r} is not a valid format string (")
    assert line.endswith("); write each field as {name} with its closing brace, and literal braces as {{ and }}")


def test_train_refuses_the_record_the_same_way_and_writes_nothing(tmp_path):
    line = refused("train", tmp_path, CASES["chat template raises (labels from the chat template)"][0])
    assert line.startswith("train_file record 1 (counting from 0): the chat template cannot render it (TemplateError: ")


@pytest.mark.parametrize(("turns", "split", "message"), [
    ([("user", "hi")], "train_file",
     "its messages have no assistant turn, so nothing of it would be trained; add the assistant's reply or remove the "
     "record"),
    ([("user", "hi"), ("assistant", "yo"), ("user", "and?")], "eval_file",
     "its messages end in a 'user' turn that no assistant turn answers (it would be forwarded but never trained); end "
     "the record with the assistant's reply or drop the last turn"),
])
@pytest.mark.parametrize("response_template", [None, "### Answer:"])
def test_a_chat_record_without_a_reply_to_train_is_refused_by_name(turns, split, message, response_template,
                                                                   tmp_path):
    # it was dropped with "response template missing, or the completion cut off by max_length": neither applied,
    # the record was not named and the run went on
    good = chat(("user", "hi"), ("assistant", "yo"))
    files = {"train_file": [good, good], "eval_file": [good, good]}
    files[split] = [good, chat(*turns)]
    extra = ["--eval_file", str(write_jsonl(tmp_path / "eval.jsonl", files["eval_file"]))]
    if response_template:
        extra += ["--response_template", response_template]
    line = refused("train", tmp_path, files["train_file"], *extra)
    assert line == f"{split} record 1 (counting from 0): {message}"
