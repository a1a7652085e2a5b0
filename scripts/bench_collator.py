"""Collation throughput: trl-padfree vs TRL 0.19.1's DataCollatorForCompletionOnlyLM, side by side.

Both collators build padding-free batches with completion masking from the same tokenized examples (batches of 8
examples of ~450 tokens by default). TRL 0.19.1 cannot be installed beside TRL 1.x, so its wheel is fetched from
the package index (``pip download trl==0.19.1 --no-deps``, cached under ``~/.cache/trl-padfree``; or pass
``--trl-wheel PATH``) and its unmodified ``DataCollatorForCompletionOnlyLM`` class is loaded from it. For reference
the script also times transformers' ``DataCollatorWithFlattening`` (flattening only, no masking).

    python scripts/bench_collator.py [--batches 300] [--batch-size 8] [--tokens 450]
"""

from __future__ import annotations

import argparse
import ast
import random
import subprocess
import sys
import time
import typing
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree.testing import tiny_byte_level_tokenizer

CACHE = Path.home() / ".cache" / "trl-padfree"
WORDS = "the of and a to in is you that it he was for on are as with his they at be this have from".split()


def load_trl_0191_collator(wheel: Path | None):
    """TRL 0.19.1's class, loaded from its wheel's ``trl/trainer/utils.py`` without importing the rest of TRL."""
    if wheel is None:
        CACHE.mkdir(parents=True, exist_ok=True)
        found = sorted(CACHE.glob("trl-0.19.1-*.whl"))
        if not found:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "trl==0.19.1", "--no-deps", "-d", str(CACHE)]
            subprocess.run(cmd, check=True)
            found = sorted(CACHE.glob("trl-0.19.1-*.whl"))
        wheel = found[0]
    source = zipfile.ZipFile(wheel).read("trl/trainer/utils.py").decode()
    node = next(n for n in ast.parse(source).body
                if isinstance(n, ast.ClassDef) and n.name == "DataCollatorForCompletionOnlyLM")
    namespace = {"DataCollatorForLanguageModeling": DataCollatorForLanguageModeling, "np": np, "torch": torch,
                 "warnings": warnings, "Any": typing.Any, "Optional": typing.Optional, "Union": typing.Union}
    exec(compile(ast.Module([node], []), f"{wheel.name}:trl/trainer/utils.py", "exec"), namespace)
    return namespace["DataCollatorForCompletionOnlyLM"], wheel


def make_features(tok, n: int, mean_tokens: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    tokens_per_word = len(tok(text(1000), add_special_tokens=False)["input_ids"]) / 1000
    features = []
    for _ in range(n):
        words = max(20, int(rng.gauss(mean_tokens, mean_tokens * 0.3) / tokens_per_word))
        features.append({"input_ids": tok(f"### Question: {text(int(words * 0.6))}\n### Answer: "
                                          f"{text(int(words * 0.4))}")["input_ids"]})
    return features


def timed(collate, batches, repeats: int = 3) -> float:
    """Best-of-``repeats`` examples/s over all batches."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            collate(b)
        best = min(best, time.perf_counter() - start)
    return sum(len(b) for b in batches) / best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--tokens", type=int, default=450, help="mean example length in tokens")
    p.add_argument("--trl-wheel", type=Path, default=None, help="path to trl-0.19.1-py3-none-any.whl")
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    tok = tiny_byte_level_tokenizer()
    features = make_features(tok, args.batches * args.batch_size, args.tokens)
    batches = [features[i : i + args.batch_size] for i in range(0, len(features), args.batch_size)]
    mean_len = np.mean([len(f["input_ids"]) for f in features])
    template_ids = tok.encode("### Answer:", add_special_tokens=False)
    ours = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    ours_ids = DataCollatorForCompletionOnlyLM(template_ids, tokenizer=tok, padding_free=True)
    rows = [("trl-padfree (text templates, padding-free)", timed(ours, batches)),
            ("trl-padfree (token-id template, padding-free)", timed(ours_ids, batches))]
    try:
        Old, wheel = load_trl_0191_collator(args.trl_wheel)
        old = Old(template_ids, tokenizer=tok, padding_free=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # same labels on this data (the template's ids are found in context here), so the race is fair
            a, b = ours(batches[0]), old(batches[0])
            assert a["labels"].tolist() == b["labels"].tolist(), "labels differ from TRL 0.19.1 on the benchmark data"
            rows.append((f"TRL 0.19.1 ({wheel.name})", timed(old, batches)))
    except (subprocess.CalledProcessError, OSError, StopIteration, KeyError) as exc:
        print(f"[bench_collator] TRL 0.19.1 unavailable ({exc}); pass --trl-wheel PATH to compare", file=sys.stderr)
    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    rows.append(("transformers DataCollatorWithFlattening (no masking)", timed(flat, batches)))

    print(f"{len(batches)} batches x {args.batch_size} examples, mean {mean_len:.0f} tokens/example, 1 thread")
    base = dict(rows).get(next((n for n, _ in rows if n.startswith("TRL 0.19.1")), ""), None)
    for name, rate in rows:
        ratio = f"{rate / base:6.1f}x TRL 0.19.1" if base else ""
        print(f"  {name:<55} {rate:>10,.0f} examples/s  {1e3 * args.batch_size / rate:7.3f} ms/batch  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
