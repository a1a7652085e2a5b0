"""Real tokenizers (``make real-tokenizers``) and labelling cases with a ground truth from character spans found by
plain string search (the rule of docs/templates.md) and the tokenizer's ``offset_mapping``: a token is trained iff
its first character lies in a trained span. ``python tests/real_cases.py`` prints the exact-match counts."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from functools import cache

import pytest
from paths import ROOT

CACHE = ROOT / ".cache" / "real-tokenizers"
MISSING = (
    f"The real tokenizers are not built ({CACHE}/manifest.json is missing). Run `make real-tokenizers` "
    "(it downloads llama-cpp-python's source archive with pip once and builds them; `make test` does it too)."
)
IGNORE = -100


def cache_problem() -> str | None:
    """Why the real-tokenizer tests cannot run (the make target to run), or None."""
    path = CACHE / "manifest.json"
    if not path.exists():
        return MISSING
    built = json.loads(path.read_text()).get("families", {})
    missing = [f for f in FAMILIES if f not in built or built[f].get("out_mismatches")]  # ids other than the original's
    return f"The real-tokenizer cache {CACHE} has no faithful {', '.join(missing)}: run `make real-tokenizers`." if missing else None


@pytest.fixture(scope="session", autouse=True)
def real_tokenizers_built():
    """Imported by the real-tokenizer test modules: without the cache their tests fail, saying how to build it."""
    if cache_problem():
        pytest.fail(cache_problem(), pytrace=False)


@cache
def load(family: str):
    from transformers import AutoTokenizer

    if cache_problem():
        raise FileNotFoundError(cache_problem())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(str(CACHE / family))


@dataclass(frozen=True)
class ChatLayout:
    """The headers a family's chat template writes (for the template-string collator) and what it supports."""

    response: str
    instructions: tuple[str, ...]
    system: bool = True
    tool: bool = False


CHAT: dict[str, ChatLayout] = {
    "llama-2": ChatLayout("[/INST]", ("[INST]",)),
    "mistral-inst": ChatLayout("[/INST]", ("[INST]",), system=False),
    "llama-3": ChatLayout("<|start_header_id|>assistant<|end_header_id|>\n\n", ("<|start_header_id|>user",
                          "<|start_header_id|>system", "<|start_header_id|>ipython"), tool=True),
    "qwen2": ChatLayout("<|im_start|>assistant\n", ("<|im_start|>user\n", "<|im_start|>system\n"), tool=True),
    "qwen3.5": ChatLayout("<|im_start|>assistant\n", ("<|im_start|>user\n", "<|im_start|>system\n"), tool=True),
    "phi-3": ChatLayout("<|assistant|>\n", ("<|user|>\n", "<|system|>\n")),
    "deepseek-llm": ChatLayout("Assistant:", ("User:",)),
    "deepseek-coder": ChatLayout("### Response:\n", ("### Instruction:\n",)),
    "command-r": ChatLayout("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", ("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
                            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>")),
    "gemma-4": ChatLayout("<|turn>model\n", ("<|turn>user\n", "<|turn>system\n", "<|turn>tool\n"), tool=True),
}
PLAIN_ONLY = ("gpt-2", "falcon", "mpt", "starcoder", "refact")
FAMILIES = tuple(CHAT) + PLAIN_ONLY

HI_BYE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
          {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Ciao"}]  # two short exchanges
USER = ["Hi", "What is 2+2?", "  leading spaces", "Zähle bis 3 ½ — bitte", "code:\n```py\nprint('x')\n```",
        "emoji 🦙 and 東京", "Why?\n\n", "1234567 + 89"]
ASSISTANT = ["Hello", "4", "Sure.\n", "Eins, zwei, drei.", "```\nx\n```", "🦙! 東京です", " yes ", "1234656."]


def conversations(layout: ChatLayout) -> list[list[dict]]:
    """Single-turn, multi-turn, with and without a system turn, and tool turns where the template has them."""
    n = len(USER)
    out = []
    for k in range(n):
        system = [{"role": "system", "content": f"You are helper {k}."}] if layout.system else []
        out.append(system + [{"role": "user", "content": USER[k]}, {"role": "assistant", "content": ASSISTANT[k]}])
        turns = []
        for j in range(3):
            turns += [{"role": "user", "content": USER[(k + j) % n]},
                      {"role": "assistant", "content": ASSISTANT[(k + 2 * j) % n]}]
        out.append(turns)
        out.append(system + turns[:4])
        if layout.tool:
            out.append(system + [
                {"role": "user", "content": USER[k]},
                {"role": "assistant", "content": "Let me look that up."},
                {"role": "tool", "content": f"result {k}: {ASSISTANT[k]}"},
                {"role": "assistant", "content": ASSISTANT[(k + 1) % n]},
            ])
    return out


def trained_spans(text: str, response: str, instructions: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """Character spans trained under the rule of docs/templates.md, by plain string search."""

    def all_starts(pattern: str) -> list[int]:  # overlapping occurrences too
        return [m.start() for m in re.finditer(f"(?={re.escape(pattern)})", text)]

    responses = all_starts(response)
    if not instructions:
        return [(responses[-1] + len(response), len(text))] if responses else []
    events = [(s + len(response), 1) for s in responses] + [(s, 0) for s in responses]
    events += [(s, 0) for pattern in instructions for s in all_starts(pattern)]
    spans, begin = [], None
    for pos, on in sorted(events, key=lambda e: (e[0], -e[1])):
        if on and begin is None:
            begin = pos
        elif not on and begin is not None:
            spans.append((begin, pos))
            begin = None
    if begin is not None:
        spans.append((begin, len(text)))
    return spans


def labels_from_spans(tokenizer, text: str, spans: list[tuple[int, int]], add_special_tokens: bool):
    """``(input_ids, labels)``: a token is trained iff its first character lies in a span; never the first token."""
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = []
    for i, (tid, (start, end)) in enumerate(zip(ids, enc["offset_mapping"], strict=True)):
        trained = i > 0 and end > start and any(s <= start < e for s, e in spans)
        labels.append(tid if trained else IGNORE)
    return ids, labels


@dataclass
class Case:
    family: str
    format: str
    text: str
    input_ids: list[int]
    labels: list[int]  # ground truth
    response: str
    instructions: tuple[str, ...] | None
    messages: list[dict] | None = None


def plain_cases(family: str) -> list[Case]:
    tok = load(family)
    eos = tok.eos_token or ""
    cases = []
    n = len(USER)
    for k in range(n):
        for fmt, text, resp, instr in [
            ("qa", f"### Question: {USER[k]}\n### Answer: {ASSISTANT[k]}{eos}", "### Answer:", None),
            ("qa-tight", f"### Question:{USER[k]}\n### Answer:{ASSISTANT[k]}{eos}", "### Answer:", None),
            ("human-assistant",
             f"### Human: {USER[k]}\n### Assistant: {ASSISTANT[k]}\n### Human: {USER[(k + 1) % n]}\n"
             f"### Assistant: {ASSISTANT[(k + 3) % n]}{eos}", "### Assistant:", ("### Human:",)),
        ]:
            spans = trained_spans(text, resp, instr or ())
            ids, labels = labels_from_spans(tok, text, spans, add_special_tokens=True)
            cases.append(Case(family, fmt, text, ids, labels, resp, instr))
    return cases


def chat_cases(family: str) -> list[Case]:
    tok = load(family)
    layout = CHAT[family]
    cases = []
    for messages in conversations(layout):
        text = tok.apply_chat_template(messages, tokenize=False)
        spans = trained_spans(text, layout.response, layout.instructions)
        ids, labels = labels_from_spans(tok, text, spans, add_special_tokens=False)
        cases.append(Case(family, "chat-template", text, ids, labels, layout.response, layout.instructions, messages))
    return cases


def all_cases(family: str) -> list[Case]:
    return plain_cases(family) + (chat_cases(family) if family in CHAT else [])


def collator_labels(cases: list[Case]) -> list[list[int]]:
    """Labels the template-string collator gives each case (cases grouped by their templates, one batch each)."""
    from trl_padfree import DataCollatorForCompletionOnlyLM

    out: dict[int, list[int]] = {}
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault((c.response, c.instructions), []).append(i)
    for (response, instructions), index in groups.items():
        tok = load(cases[index[0]].family)
        collator = DataCollatorForCompletionOnlyLM(response, list(instructions) if instructions else None, tokenizer=tok,
                                                   padding_free=True, on_template_not_found="ignore")
        batch = collator([{"input_ids": cases[i].input_ids} for i in index])
        flat = batch["labels"][0].tolist()
        cu = batch["cu_seq_lens_q"].tolist()
        for j, i in enumerate(index):
            out[i] = flat[cu[j] : cu[j + 1]]
    return [out[i] for i in range(len(cases))]


def report() -> dict[str, tuple[int, int]]:
    """``family -> (exact, total)`` for the template-string collator; construction errors count as misses."""
    counts = {}
    for family in FAMILIES:
        cases = all_cases(family)
        exact = 0
        for fmt in dict.fromkeys(c.format for c in cases):
            part = [c for c in cases if c.format == fmt]
            try:
                got = collator_labels(part)
            except ValueError as exc:
                print(f"  {family} {fmt}: collator refused: {str(exc)[:100]}")
                continue
            exact += sum(g == c.labels for g, c in zip(got, part, strict=True))
        counts[family] = (exact, len(cases))
        print(f"{family:15s} {exact:4d} / {len(cases):4d}", flush=True)
    total = sum(e for e, _ in counts.values()), sum(n for _, n in counts.values())
    print(f"{'all':15s} {total[0]:4d} / {total[1]:4d}")
    return counts


if __name__ == "__main__":
    report()
