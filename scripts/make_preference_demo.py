#!/usr/bin/env python
"""Build the preference demo data shipped in ``trl_padfree/demo/data/``: ``pref_train.jsonl`` / ``pref_eval.jsonl``.

TRL's ``{"prompt", "chosen", "rejected"}`` pairs from the SFT demo's tasks (``scripts/make_demo_assets.py``): the
prompt ``### Question: {instruction}\\n### Answer:``, the correct answer chosen, a worse one rejected (a refusal,
the question echoed, the answer cut half-way or shuffled). Seeded; eval prompts are not in train.

    python scripts/make_preference_demo.py                 # writes trl_padfree/demo/data/pref_*.jsonl
    python scripts/make_preference_demo.py --out /tmp/demo
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import make_demo_assets as assets  # noqa: E402  (scripts/ is not a package)

SEED, N_TRAIN, N_EVAL = 4321, 1200, 100
REFUSALS = ("Sorry, I cannot help with that.", "I do not know.", "That is not something I can answer.",
            "I am not sure what you mean.")


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
        record = assets.make_record(rng)
        prompt = f"### Question: {record['instruction']}\n### Answer:"
        if prompt in exclude:
            continue
        rejected = worse_answer(rng, record["instruction"], record["output"])
        if rejected != record["output"]:
            pairs.append({"prompt": prompt, "chosen": " " + record["output"], "rejected": " " + rejected})
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("trl_padfree/demo"), help="output folder")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    args = parser.parse_args(argv)
    train = make_pairs(args.seed, N_TRAIN)
    evals = make_pairs(args.seed + 1, N_EVAL, exclude=frozenset(p["prompt"] for p in train))
    for stem, rows in (("pref_train", train), ("pref_eval", evals)):
        assets.write_jsonl(args.out / "data" / f"{stem}.jsonl", rows)
    print(f"wrote {len(train)} + {len(evals)} preference pairs under {args.out / 'data'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
