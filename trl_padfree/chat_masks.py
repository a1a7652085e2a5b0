"""Labels for chat (``messages``) data taken from the tokenizer's own chat template: every assistant turn trained.

No template strings: the conversation is rendered turn by turn with the tokenizer's chat template, and what each
assistant message adds to the text is trained.

- A turn starts where ``render(messages[:i], add_generation_prompt=True)`` ends (so the assistant header the
  template writes, ``<|im_start|>assistant\\n``, ``[/INST]``, ``<|start_header_id|>assistant...``, is not trained),
  as far as the whole conversation really continues with that prompt (Gemma-4's prompt also opens an empty
  thought channel that the rendered history does not have). The earlier turns must render the same with and
  without the later ones; a template that drops or rewrites earlier turns (Qwen3.5's drops the thinking block
  of turns before the last user message) is refused with :class:`ChatMaskError`, never silently mislabelled.
- A turn ends where ``render(messages[:i + 1])`` stops agreeing with the whole conversation. What a template
  appends only at the very end of a text (Phi-3's ``<|endoftext|>``) is not part of a middle turn; where that
  tail shares characters with the next header (``<|endoftext|>`` and ``<|user|>`` both begin ``<|``), the end
  moves back to the start of the added token that holds the point, so no header token is ever trained.
- Templates with ``{% generation %}`` blocks are honoured as they are: the spans come from transformers'
  ``return_assistant_tokens_mask``.

The text is tokenized once (``add_special_tokens=False``: the template writes BOS itself), and a token is
trained iff its first character lies in an assistant span (the package's straddling rule). The first token of
an example is never trained. System, user and tool turns, repeated roles and multi-turn conversations need
nothing special.

Example (a minimal chat template on a tiny tokenizer):
    >>> from trl_padfree.testing import tiny_byte_level_tokenizer
    >>> tok = tiny_byte_level_tokenizer()
    >>> tok.chat_template = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}"
    ...                      "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
    >>> chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
    ...         {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]
    >>> text, spans = assistant_spans(tok, chat)
    >>> [text[a:b] for a, b in spans]
    ['4<eos>', '6<eos>']
    >>> ex = chat_labels(tok, chat)
    >>> tok.decode([t for t, lab in zip(ex["input_ids"], ex["labels"]) if lab != -100])
    '4<eos>6<eos>'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ChatMaskError", "assistant_spans", "chat_labels", "label_chats", "untrained_assistant_turns"]

IGNORE_INDEX = -100
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatMaskError(ValueError):
    """The chat template cannot be rendered turn by turn in a way that locates every assistant turn."""


def _render(tokenizer: Any, messages: Sequence[dict], generation_prompt: bool, **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt,
                                         **kwargs)


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``: slices compared in C, the range halved each step."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _inside_added(offsets: np.ndarray, ids: list[int], added: set[int], point: int) -> int | None:
    """Start of the added token of the text that holds ``point`` strictly inside it, if any."""
    inside = np.flatnonzero((offsets[:, 0] < point) & (offsets[:, 1] > point))
    if inside.size and ids[int(inside[0])] in added:
        return int(offsets[inside[0], 0])
    return None


def _spans_by_rendering(tokenizer: Any, messages: Sequence[dict], full: str, offsets: np.ndarray, ids: list[int],
                        **kwargs: Any) -> list[tuple[int, int]]:
    added = {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        try:
            before = _render(tokenizer, messages[:i], False, **kwargs) if i else ""
            prompt = _render(tokenizer, messages[:i], True, **kwargs) if i else ""
            upto = _render(tokenizer, messages[: i + 1], False, **kwargs)
        except Exception as exc:  # jinja raises whatever the template raises
            raise ChatMaskError(
                f"the chat template cannot render the conversation up to message {i} ({type(exc).__name__}: {exc}); "
                "assistant turns cannot be located turn by turn: pass response_template/instruction_template instead"
            ) from None
        history = before[: _common_prefix(before, prompt)]  # without what a template writes at a text's end only
        if not full.startswith(history):
            raise ChatMaskError(
                f"the chat template renders the conversation before assistant message {i} differently when later "
                "messages follow (it rewrites earlier turns), so its turns cannot be told apart by rendering; add "
                "{% generation %} blocks to the template or pass response_template/instruction_template instead"
            )
        # the generation prompt as far as the conversation really continues with it
        start = max(len(history), _common_prefix(prompt, full))
        end = _common_prefix(upto, full)
        if end < len(upto):  # a tail the template writes only at the end of a text: stop before it
            snapped = _inside_added(offsets, ids, added, end)
            end = snapped if snapped is not None else end
        content = message.get("content")
        if end <= start or (isinstance(content, str) and content.strip() and content.strip() in upto[start:]
                            and content.strip() not in full[start:end]):
            raise ChatMaskError(
                f"the chat template renders assistant message {i} differently when later messages follow (it drops or "
                "rewrites earlier turns, as templates that strip the reasoning of earlier turns do), so what each "
                "assistant message adds cannot be found by rendering turn by turn; add {% generation %} blocks to "
                "the template or pass response_template/instruction_template instead"
            )
        spans.append((start, end))
    return spans


def _spans_from_generation_blocks(tokenizer: Any, messages: Sequence[dict], full: str, offsets: np.ndarray,
                                  **kwargs: Any) -> list[tuple[int, int]]:
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, **kwargs)
    mask = np.asarray(out["assistant_masks"], dtype=bool)
    if mask.size != len(offsets):
        raise ChatMaskError("the chat template's {% generation %} mask does not align with the tokenized text")
    spans = []
    for t in np.flatnonzero(mask):
        a, b = int(offsets[t, 0]), int(offsets[t, 1])
        if spans and spans[-1][1] >= a:
            spans[-1] = (spans[-1][0], max(b, spans[-1][1]))
        else:
            spans.append((a, b))
    return spans


def assistant_spans(tokenizer: Any, messages: Sequence[dict], **kwargs: Any) -> tuple[str, list[tuple[int, int]]]:
    """Render ``messages`` with the tokenizer's chat template: ``(text, character spans of the assistant turns)``.

    ``kwargs`` go to ``apply_chat_template`` (``tools=...``, ``chat_template=...``).
    """
    text, spans, _, _ = _analyse(tokenizer, messages, **kwargs)
    return text, spans


def _analyse(tokenizer: Any, messages: Sequence[dict], **kwargs: Any):
    if not getattr(tokenizer, "is_fast", False):
        raise ChatMaskError(
            f"{type(tokenizer).__name__} is not a fast tokenizer: chat-template masks need its offset mapping; load "
            "the tokenizer with use_fast=True"
        )
    messages = [dict(m) for m in messages]
    full = _render(tokenizer, messages, False, **kwargs)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    template = kwargs.get("chat_template") or tokenizer.chat_template or ""
    if isinstance(template, str) and _GENERATION.search(template):
        spans = _spans_from_generation_blocks(tokenizer, messages, full, offsets, **kwargs)
    else:
        spans = _spans_by_rendering(tokenizer, messages, full, offsets, ids, **kwargs)
    return full, spans, ids, offsets


def _trained(offsets: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    trained = np.zeros(len(offsets), dtype=bool)
    first, nonempty = offsets[:, 0], offsets[:, 1] > offsets[:, 0]
    for a, b in spans:
        trained |= (first >= a) & (first < b) & nonempty
    if trained.size:
        trained[0] = False  # the first token of an example is never a target
    return trained


def chat_labels(tokenizer: Any, messages: Sequence[dict], ignore_index: int = IGNORE_INDEX,
                **kwargs: Any) -> dict[str, list[int]]:
    """One conversation -> ``{"input_ids", "labels", "completion_mask"}``: assistant turns trained, the rest not.

    Hand the examples to ``DataCollatorForCompletionOnlyLM(None, tokenizer=tok, padding_free=True)``, which keeps
    the labels it is given and only flattens.
    """
    _, spans, ids, offsets = _analyse(tokenizer, messages, **kwargs)
    trained = _trained(offsets, spans)
    return {
        "input_ids": ids,
        "labels": [t if keep else ignore_index for t, keep in zip(ids, trained.tolist(), strict=True)],
        "completion_mask": trained.astype(int).tolist(),
    }


def label_chats(batch: dict[str, list[Any]], tokenizer: Any, messages_field: str = "messages",
                tools_field: str | None = "tools", ignore_index: int = IGNORE_INDEX) -> dict[str, list[list[int]]]:
    """Batched ``datasets.map`` function: ``dataset.map(label_chats, batched=True, fn_kwargs={"tokenizer": tok})``.

    Adds ``input_ids``, ``labels`` and ``completion_mask`` from each record's ``messages`` (and ``tools``, if the
    data has that column).
    """
    out: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "completion_mask": []}
    tools = batch.get(tools_field) if tools_field else None
    for k, messages in enumerate(batch[messages_field]):
        kwargs = {"tools": tools[k]} if tools is not None and tools[k] else {}
        example = chat_labels(tokenizer, messages, ignore_index=ignore_index, **kwargs)
        for key in out:
            out[key].append(example[key])
    return out


def untrained_assistant_turns(tokenizer: Any, messages: Sequence[dict], input_ids: Sequence[int],
                              labels: Sequence[int], ignore_index: int = IGNORE_INDEX, **kwargs: Any) -> int:
    """How many assistant turns of a conversation have no trained token in ``labels`` (e.g. a collator's).

    ``input_ids`` must be the tokenized chat-template text (as :func:`chat_labels` gives); otherwise 0 is returned
    and nothing is judged.
    """
    _, spans, ids, offsets = _analyse(tokenizer, messages, **kwargs)
    n = min(len(ids), len(labels))
    if list(input_ids[:n]) != ids[:n]:
        return 0
    trained = np.asarray(labels[:n]) != ignore_index
    first = offsets[:n, 0]
    missing = 0
    for a, b in spans:
        turn = (first >= a) & (first < b)
        if turn.any() and not (turn & trained).any():
            missing += 1
    return missing
