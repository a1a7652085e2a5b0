"""``trl-padfree train`` on ``messages`` data: chat-template masks by default, a warning for untrained turns."""

from __future__ import annotations

import json

import pytest
from real_cases import CACHE, CHAT, cache_problem, conversations, load

from trl_padfree.chat_masks import chat_labels
from trl_padfree.launch import ConfigError, load_config
from trl_padfree.launch.tasks.sft_data import prepare_data

QWEN = CHAT["qwen2"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    if cache_problem():
        pytest.fail(cache_problem(), pytrace=False)
    convs = conversations(QWEN)
    path = tmp_path_factory.mktemp("chat") / "train.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs), encoding="utf-8")
    return load("qwen2"), convs, path


def prepare(tokenizer, argv):
    cfg = load_config(["--model_name_or_path", str(CACHE / "qwen2"), "--output_dir", "/nonexistent/out",
                       "--max_length", "4096", *argv])
    return prepare_data(cfg, tokenizer)


def test_messages_without_templates_train_every_assistant_turn(qwen, capsys):
    tok, convs, path = qwen
    data = prepare(tok, ["--train_file", str(path)])
    assert data.text_format == "messages" and len(data.train) == len(convs)
    assert data.train.column_names == ["input_ids", "labels"]
    for k, messages in enumerate(convs):
        want = chat_labels(tok, messages)
        assert data.train[k]["input_ids"] == want["input_ids"]
        assert data.train[k]["labels"] == [-100] + want["labels"][1:]
    assert "warning" not in capsys.readouterr().out


def test_response_template_alone_on_multi_turn_chat_says_how_many_examples_lose_turns_and_both_are_silent(qwen, capsys):
    tok, convs, path = qwen
    prepare(tok, ["--train_file", str(path), "--response_template", QWEN.response])
    lines = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    multi = [c for c in convs if sum(m["role"] == "assistant" for m in c) > 1]
    lost = sum(sum(m["role"] == "assistant" for m in c) - 1 for c in multi)
    assert lines == [
        f"[trl-padfree] warning: in {len(multi)} of the first {len(convs)} examples, {lost} assistant turn(s) get no "
        "trained token from response_template/instruction_template (without instruction_template only the last "
        "assistant turn is trained); leave both unset to train every assistant turn from the chat template"
    ]
    prepare(tok, ["--train_file", str(path), "--response_template", QWEN.response,
                  "--instruction_template", QWEN.instructions[0], "--instruction_template", QWEN.instructions[1]])
    assert "warning" not in capsys.readouterr().out


def test_plain_text_still_needs_a_response_template(qwen, tmp_path):
    tok, _, _ = qwen
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"text": "### Question: a\n### Answer: b"}) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="only prompt/completion and messages data can do without it"):
        prepare(tok, ["--train_file", str(path)])


def test_messages_whose_template_rewrites_earlier_turns_are_refused_before_training(tmp_path):
    if cache_problem():
        pytest.fail(cache_problem(), pytrace=False)
    convs = [c for c in conversations(CHAT["qwen3.5"]) if sum(m["role"] == "user" for m in c) > 1][:2]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^train_file record 0 \(counting from 0\): messages data without "
                                          r"response_template: the chat template renders "
                                          r"assistant message 1 differently when later messages follow .* pass "
                                          r"response_template/instruction_template instead$"):
        prepare(load("qwen3.5"), ["--train_file", str(path)])
