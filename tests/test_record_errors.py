"""An error raised while a record is checked, formatted or tokenized (chat templates, format strings, record shapes,
tokenizers) is one line, ``<split> record <index> (counting from 0): <cause>; <fix>``, and exit code 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from launch_runs import assert_refused_in_one_line, write_jsonl
from paths import DEMO_MODEL


def refused(command: str, tmp_path: Path, rows: list[dict], *extra) -> str:
    """``trl-padfree COMMAND`` on the demo model with ``rows`` as train_file exits 2 with one line, writing nothing;
    returns that line. An argument in ``extra`` may be a function of ``tmp_path`` that writes a file."""
    argv = ["--model_name_or_path", str(DEMO_MODEL), "--train_file", str(write_jsonl(tmp_path / "train.jsonl", rows)),
            "--output_dir", str(tmp_path / "out"), *(arg(tmp_path) if callable(arg) else arg for arg in extra)]
    if command == "train":
        argv += ["--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    return assert_refused_in_one_line("sft" if command == "train" else command, argv, tmp_path / "out")


def chat(*turns: tuple[str, str], **extra) -> dict:
    return {"messages": [{"role": role, "content": content, **extra.get(role, {})} for role, content in turns]}


def eval_file(rows: list[dict]):
    return lambda tmp_path: str(write_jsonl(tmp_path / "eval.jsonl", rows))


def python_error_template(tmp_path: Path) -> str:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% if m['n'] %}{{ m['n'] + 1 }}{% endif %}{% endfor %}")
    return str(path)


def word_level_model(tmp_path: Path) -> str:
    """The demo model with a word-level tokenizer that has no unknown token: it raises on any word it lacks."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "a", "b", "add", "and", "one", "two"]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    (model := tmp_path / "model").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(DEMO_MODEL / name, model / name)
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>").save_pretrained(model)
    return str(model)


QA = [{"instruction": "add one and two", "output": "two"}] * 3
GOOD, SYSTEM = chat(("user", "hi"), ("assistant", "yo")), chat(("system", "be brief"), ("user", "hi"), ("assistant", "yo"))
LONG_SHORT = [{"instruction": "a long question", "output": "b"}, {"instruction": "short", "output": "b"}]


def template(text: str) -> list[str]:
    return ["--template", text, "--response_template", "### Answer:"]


BAD_INDEX = template("### Question: {instruction[8]}\n### Answer: {output}")
RENDER = ("the chat template cannot render it (TemplateError: The demo chat template supports only user and assistant "
          "roles, got system)")

# (records of train_file, extra arguments, how the line starts, what else it says)
CASES = {
    "chat template raises (labels from the chat template)": (
        [GOOD, SYSTEM], [], "train_file record 1 (counting from 0): ",
        f"{RENDER}; change the record to what the template accepts, or set chat_template_path to a template that "
        "accepts it"),
    "chat template raises (response_template set)": (
        [GOOD, SYSTEM], ["--response_template", "### Answer:"], "train_file record 1 (counting from 0): ", RENDER),
    "chat template expression raises a Python error": (
        [GOOD, chat(("user", "hi"), ("assistant", "yo"), user={"n": "x"})],
        ["--chat_template_path", python_error_template], "train_file record 1 (counting from 0): ",
        'the chat template cannot render it (TypeError: can only concatenate str (not "int") to str)'),
    "format string: index out of range": (
        [LONG_SHORT[0], LONG_SHORT[0], LONG_SHORT[1]], BAD_INDEX, "train_file record 2 (counting from 0): ",
        "template '### Question: {instruction[8]}\\n### Answer: {output}' cannot format it (IndexError: string index "
        "out of range); fix the template (fields as {name}, literal braces as {{ and }}) or the record"),
    "format string: bad format spec": (
        QA, template("### Question: {instruction}\n### Answer: {output:d}"), "train_file record 0 (counting from 0): ",
        "cannot format it (ValueError: Unknown format code 'd' for object of type 'str')"),
    "format string: missing attribute": (
        QA, template("### Question: {instruction.text}\n### Answer: {output}"),
        "train_file record 0 (counting from 0): ", "cannot format it (AttributeError: 'str' object has no attribute "
        "'text')"),
    "template that is no format string, refused before the data": (
        QA, template("### Question: {instruction\n### Answer: {output}"), "template '### Question: {instruction\\n### Answer: {output}' is not a valid format string (",
        "); write each field as {name} with its closing brace, and literal braces as {{ and }}"),
    "fields that no format turns into text": (
        QA, ["--response_template", "### Answer:"], "cannot tell how to turn the data's fields (instruction, output) "
        "into text: set template", ""),
    "preference pairs given to train": ([{"prompt": "a", "chosen": "b", "rejected": "c"}], [], "cannot tell how to "
                                        "turn", "; these are preference pairs: train them with trl-padfree dpo or reward"),
    "a positional template field": (QA, template("{} and {instruction}"), "template fields must be named", ""),
    "record shape: a messages prompt with a text completion": (
        [{"prompt": [{"role": "user", "content": "hi"}], "completion": "yo"}], [],
        "train_file record 0 (counting from 0): ", "'completion' is plain text, but in record 0 'prompt' is chat "
        "messages (conversational): the data mixes plain-text and conversational records"),
    "tokenizer raises on a word it cannot encode": (
        [{"prompt": "add one and one", "completion": " two"}, {"prompt": "add one and two", "completion": " three"}],
        ["--model_name_or_path", word_level_model], "train_file record 1 (counting from 0): ",
        "the tokenizer fails on its text (Exception: WordLevel error: Missing [UNK] token from the vocabulary); fix "
        "the record's text, or use a tokenizer that accepts it (model_name_or_path)"),
    "the eval split is named": (
        QA, ["--eval_file", eval_file(LONG_SHORT), *BAD_INDEX], "eval_file record 1 (counting from 0): template ", ""),
    "after eval_fraction the record is named in file order": (
        [LONG_SHORT[i == 13] for i in range(20)], ["--eval_fraction", "0.5", *BAD_INDEX],
        "train_file record 13 (counting from 0): ", ""),
    # (a chat without a reply to train was dropped with "response template missing, or the completion cut off by
    # max_length": neither applied, the record was not named and the run went on)
    "a chat without an assistant turn": (
        [GOOD, chat(("user", "hi"))], [], "train_file record 1 (counting from 0): ",
        "its messages have no assistant turn, so nothing of it would be trained; add the assistant's reply or remove "
        "the record"),
    "a chat ending in an unanswered turn, in the eval split, response_template set": (
        [GOOD, GOOD], ["--eval_file", eval_file([GOOD, chat(("user", "hi"), ("assistant", "yo"), ("user", "and?"))]),
                       "--response_template", "### Answer:"], "eval_file record 1 (counting from 0): ",
        "its messages end in a 'user' turn that no assistant turn answers (it would be forwarded but never trained); "
        "end the record with the assistant's reply or drop the last turn"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_record_that_cannot_be_prepared_is_one_line_naming_it(case, tmp_path):
    rows, extra, start, message = CASES[case]
    line = refused("preview", tmp_path, rows, *extra)
    assert line.startswith(start) and message in line


def test_train_refuses_the_record_the_same_way_and_writes_nothing(tmp_path):
    line = refused("train", tmp_path, [GOOD, SYSTEM])
    assert line == f"train_file record 1 (counting from 0): {CASES[next(iter(CASES))][-1]}"
