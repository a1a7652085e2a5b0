"""Masks from the chat template itself (trl_padfree.chat_masks) on the real families' templates (``make
real-tokenizers``), against character-span truth: an assistant turn is trained from its header's end to the next."""

from __future__ import annotations

import pytest
import real_cases as rc
from real_cases import real_tokenizers_built  # noqa: F401  (autouse: fails saying how to build them)

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree import chat_masks as cm

NEXT_TURN = {"llama-2": ("<s>[INST]",)}  # the <s> before a user turn belongs to that turn
# the generation prompt of DeepSeek-Coder's template is "### Response:": the model generates the "\n" after it
RESPONSE = {"deepseek-coder": "### Response:"}


# Qwen3.5's template renders an assistant turn without its (empty) thinking block once a later user message
# follows: turn-by-turn rendering cannot locate such turns, see the test below.
REWRITES_EARLIER_TURNS = {"qwen3.5"}


@pytest.mark.parametrize("family", [f for f in rc.CHAT if f not in REWRITES_EARLIER_TURNS])
def test_chat_template_masks_equal_character_span_truth(family):
    tok, layout = rc.load(family), rc.CHAT[family]
    convs = rc.conversations(layout)
    assert any(m["role"] == "system" for c in convs for m in c) == layout.system
    assert any(m["role"] == "tool" for c in convs for m in c) == layout.tool
    wrong = []
    for messages in convs:
        text = tok.apply_chat_template(messages, tokenize=False)
        truth_spans = rc.trained_spans(text, RESPONSE.get(family, layout.response),
                                     NEXT_TURN.get(family, layout.instructions))
        ids, truth = rc.labels_from_spans(tok, text, truth_spans, add_special_tokens=False)
        got = cm.chat_labels(tok, messages)
        assert got["input_ids"] == ids
        assert got["completion_mask"] == [int(lab != rc.IGNORE) for lab in got["labels"]]
        if got["labels"] != truth:
            wrong.append((text, [text[a:b] for a, b in cm.assistant_spans(tok, messages)[1]], truth_spans))
        n_assistant = sum(m["role"] == "assistant" for m in messages)
        assert len(cm.assistant_spans(tok, messages)[1]) == n_assistant
    assert not wrong, f"{len(wrong)} of {len(convs)} conversations differ; first: {wrong[0]}"


def test_spans_are_exactly_what_each_assistant_message_adds():
    tok = rc.load("phi-3")  # its template appends <|endoftext|> at the very end only, and its headers strip right
    text, spans = cm.assistant_spans(tok, rc.HI_BYE)
    assert text == "<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\nCiao<|end|>\n<|endoftext|>"
    assert [text[a:b] for a, b in spans] == ["Hello<|end|>\n", "Ciao<|end|>\n<|endoftext|>"]
    # (the labels chat_labels makes of them: test_chat_template_masks_equal_character_span_truth[phi-3])


def test_label_chats_for_datasets_map_a_collator_keeps_the_labels_and_untrained_turns_are_counted():
    from datasets import Dataset

    tok = rc.load("qwen2")
    convs = rc.conversations(rc.CHAT["qwen2"])[:6]
    examples = [cm.chat_labels(tok, c) for c in convs]
    ds = Dataset.from_dict({"messages": convs}).map(cm.label_chats, batched=True, fn_kwargs={"tokenizer": tok})
    assert ds["labels"] == [e["labels"] for e in examples]
    batch = DataCollatorForCompletionOnlyLM(None, tokenizer=tok, padding_free=True)(
        [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples])
    assert batch["labels"][0].tolist() == [lab for e in examples for lab in e["labels"]]
    messages, ex = convs[1], examples[1]  # three exchanges, no system turn
    single = DataCollatorForCompletionOnlyLM("<|im_start|>assistant\n", tokenizer=tok, padding_free=True)
    labels = single([{"input_ids": ex["input_ids"]}])["labels"][0].tolist()
    assert cm.untrained_assistant_turns(tok, messages, ex["input_ids"], labels) == 2  # only the last turn trained
    assert cm.untrained_assistant_turns(tok, messages, ex["input_ids"], ex["labels"]) == 0


def test_generation_blocks_are_used_and_a_template_that_rewrites_earlier_turns_is_refused():
    tok = rc.load("qwen2")
    template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}{% if m['role'] == 'assistant' %}"
                "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
                "{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    text, spans = cm.assistant_spans(tok, rc.HI_BYE, chat_template=template)
    assert [text[a:b] for a, b in spans] == ["Hello<|im_end|>", "Ciao<|im_end|>"]  # the mask leaves "\n" out
    # a template that drops every assistant turn but the last one (as templates that strip earlier reasoning do)
    template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
                "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with pytest.raises(cm.ChatMaskError, match="renders assistant message 1 differently when later messages follow.*"
                                            "response_template/instruction_template"):
        cm.chat_labels(tok, rc.HI_BYE, chat_template=template)


def test_qwen35_turns_are_exact_where_located_and_refused_where_the_template_rewrites_them():
    tok, layout = rc.load("qwen3.5"), rc.CHAT["qwen3.5"]
    located = refused = 0
    for messages in rc.conversations(layout):
        text = tok.apply_chat_template(messages, tokenize=False)
        if sum(m["role"] == "user" for m in messages) > 1:  # earlier turns lose their thinking block
            with pytest.raises(cm.ChatMaskError, match=r"renders assistant message [12] differently when later messages"):
                cm.chat_labels(tok, messages)
            refused += 1
            continue
        # the generation prompt opens the thinking block: the model generates from after "<think>\n"
        truth_spans = rc.trained_spans(text, "<|im_start|>assistant\n<think>\n", layout.instructions)
        _, truth = rc.labels_from_spans(tok, text, truth_spans, add_special_tokens=False)
        assert cm.chat_labels(tok, messages)["labels"] == truth
        located += 1
    assert (located, refused) == (16, 16)


def test_common_prefix_is_the_longest_common_prefix():
    import random

    def naive(a: str, b: str) -> int:
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    rng = random.Random(0)
    for _ in range(2000):
        a = "".join(rng.choice("ab✓") for _ in range(rng.randrange(0, 40)))
        b = a[: rng.randrange(0, len(a) + 1)] + "".join(rng.choice("ab✓") for _ in range(rng.randrange(0, 5)))
        assert cm._common_prefix(a, b) == cm._common_prefix(b, a) == naive(a, b), (a, b)
