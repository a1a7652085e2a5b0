#!/usr/bin/env python
"""Build the demo assets shipped in ``trl_padfree/demo/`` from code with fixed seeds (re-running reproduces them).

* ``data/train.jsonl`` / ``eval.jsonl``: ``{"instruction", "output"}`` records of 13 synthetic tasks a tiny model
  can learn, with FLAN-like lengths scaled down (lognormal, median ~65 tokens, capped at 400);
* ``data/chat_train.jsonl`` / ``chat_eval.jsonl``: ``{"messages": [...]}`` with 2-3 user / assistant turns;
* ``data/pref_train.jsonl`` / ``pref_eval.jsonl``: TRL's ``{"prompt", "chosen", "rejected"}`` pairs of the same tasks
  (the prompt ``### Question: {instruction}\\n### Answer:``, the correct answer chosen, a worse one rejected: a
  refusal, the question echoed, the answer cut half-way or shuffled);
* ``model/``: a byte-level BPE tokenizer trained on the demo text (with a chat template rendering the same
  ``### Question:`` / ``### Answer:`` format) and a tiny random-init ``LlamaForCausalLM``.

    python scripts/make_demo_assets.py                      # writes trl_padfree/demo
    python scripts/make_demo_assets.py --out /tmp/demo --data-only
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import string
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

SEED, N_TRAIN, N_EVAL, N_CHAT_TRAIN, N_CHAT_EVAL = 1234, 3000, 200, 400, 40
PREF_SEED_OFFSET, N_PREF_TRAIN, N_PREF_EVAL = 3087, 1200, 100  # preference pairs: seed 4321 by default
REFUSALS = ("Sorry, I cannot help with that.", "I do not know.", "That is not something I can answer.",
            "I am not sure what you mean.")
TEMPLATE = "### Question: {instruction}\n### Answer: {output}"
RESPONSE_TEMPLATE, INSTRUCTION_TEMPLATE = "### Answer:", "### Question:"
LENGTH_MEDIAN, LENGTH_SIGMA, LENGTH_MIN, LENGTH_MAX = 80.0, 0.75, 14, 400  # example tokens: lognormal, clipped

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
VOCAB_SIZE = 768
#: Tiny Llama: 4 layers, hidden 128, 4 query heads sharing 2 key/value heads.
MODEL_CONFIG = {"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "initializer_range": 0.02, "tie_word_embeddings": True}

WORDS = "red blue green pink cat dog fish bird cow pig apple pear cup pen box hat".split()

#: Chat template rendering the same format as TEMPLATE, each assistant turn ending with EOS and a newline; the
#: answers are wrapped in {% generation %} for ``return_assistant_tokens_mask``. (transformers renders with
#: trim_blocks, which drops a newline right after a block tag, hence the ``{{ '\\n' }}``.)
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}### Question: {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}"
    "### Answer:{% generation %} {{ message['content'] }}{{ eos_token }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "{{ raise_exception('The demo chat template supports only user and assistant roles, got ' + message['role']) }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}### Answer:{% endif %}"
)

Task = Callable[[random.Random, int], tuple[str, str]]
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """Words, numbers and punctuation marks in ``text``: close to the demo tokenizer's count on this data."""
    return len(_TOKEN_RE.findall(text))


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def _nums(values) -> str:
    return " ".join(map(str, values))


# Rule-following tasks (a tiny model learns them in a few hundred steps), copy-type tasks (the answer is built from
# the question's words) and short-answer tasks (the short end of the length spread); ``n`` sets the length.
def task_count_up(rng, n):
    n = min(n, 150)
    start = rng.randrange(0, 200 - n)
    return f"Count from {start} to {start + n - 1}.", _nums(range(start, start + n))


def task_count_down(rng, n):
    n = min(n, 150)
    start = rng.randrange(n - 1, 200)
    return f"Count down from {start} to {start - n + 1}.", _nums(range(start, start - n, -1))


def task_count_by(rng, n):
    step = rng.choice([2, 3, 5, 10])
    n = min(n, 300 // step)
    start = step * rng.randrange(0, 300 // step - n + 1)
    values = range(start, start + step * n, step)
    return f"Count by {step}s from {values[0]} to {values[-1]}.", _nums(values)


def task_times_table(rng, n):
    k, n = rng.randint(2, 12), min(max(n, 2), 30)
    return f"Write the {k} times table up to {n}.", ", ".join(f"{k} x {i} = {k * i}" for i in range(1, n + 1)) + "."


def task_letters(rng, n):
    letters = string.ascii_lowercase if rng.random() < 0.5 else string.ascii_uppercase
    n = min(max(n, 2), 26)
    start = rng.randrange(0, 27 - n)
    return f"List the letters from {letters[start]} to {letters[start + n - 1]}.", " ".join(letters[start : start + n])


def task_repeat(rng, n):
    word = rng.choice(WORDS)
    return f"Repeat the word '{word}' {n} times.", " ".join([word] * n)


def task_reverse(rng, n):
    words = _words(rng, n)
    return "Reverse the order of the words: " + " ".join(words), " ".join(reversed(words))


def task_sort(rng, n):
    values = [rng.randrange(100) for _ in range(n)]
    return "Sort the numbers from smallest to largest: " + _nums(values), _nums(sorted(values))


def task_upper(rng, n):
    words = _words(rng, n)
    return "Write the words in capital letters: " + " ".join(words), " ".join(w.upper() for w in words)


def task_copy(rng, n):
    text = " ".join(_words(rng, n))
    return "Copy the text exactly: " + text, text


def task_number_words(rng, n):
    words = _words(rng, n)
    listed = " ".join(f"{i}. {w}" for i, w in enumerate(words, start=1))
    return "Number the words and count them: " + " ".join(words), f"{listed}. Count: {n}"


def task_add(rng, n):
    a, b = rng.randrange(50), rng.randrange(50)
    return f"What is {a} + {b}?", str(a + b)


def task_last(rng, n):
    words = _words(rng, n)
    if rng.random() < 0.5:
        return "What is the first word? " + " ".join(words), words[0]
    return "What is the last word? " + " ".join(words), words[-1]


TASKS: dict[str, Task] = {task.__name__[5:]: task for task in (
    task_count_up, task_count_down, task_count_by, task_times_table, task_letters, task_repeat, task_reverse,
    task_sort, task_upper, task_copy, task_number_words, task_add, task_last)}


def _example_tokens(instruction: str, output: str) -> int:
    return approx_tokens(TEMPLATE.format(instruction=instruction, output=output)) + 1


def _fit(task: Task) -> tuple[float, float]:
    """Approximate tokens per unit of ``n`` and fixed overhead of a task (linear fit at n=4 and n=24)."""
    lo, hi = (_example_tokens(*task(random.Random(0), n)) for n in (4, 24))
    per_unit = max((hi - lo) / 20, 0.05)
    return per_unit, lo - 4 * per_unit


_FITS = {name: _fit(task) for name, task in TASKS.items()}


def sample_length(rng: random.Random) -> int:
    """A target example length in tokens: lognormal (FLAN-like heavy right tail), clipped to the demo range."""
    length = rng.lognormvariate(math.log(LENGTH_MEDIAN), LENGTH_SIGMA)
    return int(min(max(length, LENGTH_MIN), LENGTH_MAX))


def sized_example(rng: random.Random, name: str, target: int) -> tuple[str, str]:
    """An example of task ``name`` about ``target`` tokens long (never over ``LENGTH_MAX``)."""
    task, (per_unit, overhead) = TASKS[name], _FITS[name]
    n = max(1, round((target - overhead) / per_unit))
    instruction, output = task(rng, n)
    while n > 1 and _example_tokens(instruction, output) > LENGTH_MAX:
        n = max(1, int(n * 0.9))
        instruction, output = task(rng, n)
    return instruction, output


def make_record(rng: random.Random) -> dict[str, str]:
    """One single-turn record ``{"instruction", "output"}`` of a random task with a FLAN-like length."""
    name = rng.choice(sorted(TASKS))
    instruction, output = sized_example(rng, name, sample_length(rng))
    return {"instruction": instruction, "output": output}


def make_records(seed: int, count: int, exclude: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """``count`` single-turn records from a generator seeded with ``seed``, none with an instruction in ``exclude``."""
    rng, records = random.Random(seed), []
    while len(records) < count:
        if (record := make_record(rng))["instruction"] not in exclude:
            records.append(record)
    return records


def make_conversations(seed: int, count: int) -> list[dict[str, list[dict[str, str]]]]:
    """``count`` multi-turn records (2-3 user/assistant turns each, shorter examples so the total stays small)."""
    rng = random.Random(seed)
    convs = []
    for _ in range(count):
        messages = []
        for _turn in range(rng.randint(2, 3)):
            name = rng.choice(sorted(TASKS))
            instruction, output = sized_example(rng, name, min(sample_length(rng), 120))
            messages += [{"role": "user", "content": instruction}, {"role": "assistant", "content": output}]
        convs.append({"messages": messages})
    return convs


def worse_answer(rng: random.Random, instruction: str, output: str) -> str:
    """A worse answer to ``instruction`` than ``output`` (never equal to it)."""
    words = output.split()
    kinds = ["refuse", "echo"] + (["cut"] if len(words) > 3 else []) + (["shuffle"] if len(set(words)) > 2 else [])
    kind = rng.choice(kinds)
    if kind == "refuse":
        return rng.choice(REFUSALS)
    if kind == "echo":
        return instruction
    if kind == "cut":
        return " ".join(words[: max(1, len(words) // 2)])
    shuffled = words[:]
    while shuffled == words:
        rng.shuffle(shuffled)
    return " ".join(shuffled)


def make_pairs(seed: int, count: int, exclude: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """``count`` preference pairs from a generator seeded with ``seed``, none with a prompt in ``exclude``."""
    rng = random.Random(seed)
    pairs: list[dict[str, str]] = []
    while len(pairs) < count:
        record = make_record(rng)
        prompt = f"### Question: {record['instruction']}\n### Answer:"
        if prompt in exclude:
            continue
        rejected = worse_answer(rng, record["instruction"], record["output"])
        if rejected != record["output"]:
            pairs.append({"prompt": prompt, "chosen": " " + record["output"], "rejected": " " + rejected})
    return pairs


def format_example(record: dict[str, str]) -> str:
    """Render a record with the demo template."""
    return TEMPLATE.format(instruction=record["instruction"], output=record["output"])


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write rows as JSON lines (stable key order, ASCII, ``\\n`` line ends) so the bytes are reproducible."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=True) + "\n")


def write_data(out: Path, seed: int = SEED) -> dict[str, list]:
    """Generate and write every data file under ``out/data`` (eval instructions not in train); the rows by stem."""
    train = make_records(seed, N_TRAIN)
    data = {
        "train": train,
        "eval": make_records(seed + 1, N_EVAL, exclude=frozenset(r["instruction"] for r in train)),
        "chat_train": make_conversations(seed + 2, N_CHAT_TRAIN),
        "chat_eval": make_conversations(seed + 3, N_CHAT_EVAL),
        "pref_train": make_pairs(seed + PREF_SEED_OFFSET, N_PREF_TRAIN),
    }
    data["pref_eval"] = make_pairs(seed + PREF_SEED_OFFSET + 1, N_PREF_EVAL,
                                   exclude=frozenset(p["prompt"] for p in data["pref_train"]))
    for stem, rows in data.items():
        write_jsonl(out / "data" / f"{stem}.jsonl", rows)
    return data


def _corpus(data: dict[str, list]) -> Iterator[str]:
    yield from map(format_example, data["train"])
    yield from (message["content"] for conv in data["chat_train"] for message in conv["messages"])


def build_tokenizer(data: dict[str, list], out_dir: Path):
    """Train a byte-level BPE on the training text and save it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[PAD, BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(data), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=MODEL_CONFIG["max_position_embeddings"], padding_side="right",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_model(tokenizer, out_dir: Path, seed: int = SEED) -> None:
    """Random-init a tiny ``LlamaForCausalLM`` for the tokenizer and save it (safetensors, float32)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    special = {f"{k}_token_id": getattr(tokenizer, f"{k}_token_id") for k in ("bos", "eos", "pad")}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), **special, **MODEL_CONFIG)).to(torch.float32)
    model.generation_config = GenerationConfig(**special)
    model.save_pretrained(out_dir, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("trl_padfree/demo"), help="output folder")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    parser.add_argument("--data-only", action="store_true", help="write only the data files (no tokenizer or model)")
    args = parser.parse_args(argv)
    data = write_data(args.out, args.seed)
    print(f"wrote {sum(len(v) for v in data.values())} records under {args.out / 'data'}")
    if args.data_only:
        return 0
    model_dir = args.out / "model"
    tokenizer = build_tokenizer(data, model_dir)
    build_model(tokenizer, model_dir, args.seed)
    print(f"wrote tokenizer (vocab {len(tokenizer)}) and model under {model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
