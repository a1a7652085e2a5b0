"""``trl-padfree bench --task reward|kto``: reward-model and KTO training speed and peak memory: TRL's padded trainers vs padding-free, side by side.

Each variant trains a randomly initialised Llama (CPU, fp32, 1 thread by default) for ``--steps`` optimizer steps
after ``--warmup`` steps, in its own process (so that peak memory is its own), on the same random data with
lognormal lengths (prompt median 64, responses median 96, sigma 0.6, clipped to 512; pre-tokenized for the reward
model, texts of that many words for KTO, whose trainer always tokenizes); the variants run in turns, ``--rounds``
times, and the medians are reported. Printed per variant: sequence tokens per second (the tokens of the sequences
themselves, the same count for every variant), peak resident memory of the training process above its level
before ``train()``, and next to each measured speed ratio the FLOP ratio of the batches (a model of the
forward+backward FLOPs: ``6 * params`` per computed token plus ``6 * layers * hidden * n^2`` of causal attention
per computed sequence of ``n`` keys, forward-only passes a third of that; padded rows count their full width).

    trl-padfree bench --task reward|kto [--steps 8] [--rounds 3] [--batch 8] [--threads 1]

The figures and the printed lines go to ``<output-dir>/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from .cli import add_output
from .report import print_and_report, refuse_unusable
from .runner import run_variants
from .targets import flop_share_verdict

VARIANTS = {"reward": ("trl-padded", "padding-free", "prompt-once"),
            "kto": ("trl-padded", "padding-free", "prompt-once")}
WORDS = ("what is the sum of and why does a cat sit on mat please answer question reverse these words sort numbers "
         "count letters in word yes no because it is true false capital city of france paris rome blue red green")
MODEL = dict(vocab_size=2048, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048)


def lengths(rng: np.random.Generator, n: int, median: float) -> list[int]:
    return np.clip(np.round(rng.lognormal(np.log(median), 0.6, n)), 1, 512).astype(int).tolist()


def dataset(task: str, n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    prompts, chosen, rejected = lengths(rng, n, 64), lengths(rng, n, 96), lengths(rng, n, 96)

    def ids(k: int) -> list[int]:
        return rng.integers(3, MODEL["vocab_size"], k).tolist()

    if task == "reward":
        rows = []
        for p, c, r in zip(prompts, chosen, rejected, strict=True):
            prompt = ids(p)
            rows.append({"chosen_ids": prompt + ids(c), "rejected_ids": prompt + ids(r)})
        return rows
    # TRL's KTOTrainer always tokenizes text: words of the tiny tokenizer's corpus, about one token each
    words = WORDS.split()

    def text(k: int) -> str:
        return " ".join(words[i] for i in rng.integers(0, len(words), k))

    return [{"prompt": text(p), "completion": " " + text(c), "label": bool(rng.random() < 0.5)}
            for p, c in zip(prompts, chosen, strict=True)]


def flop_model(rows_of_keys: list[list[int]], params: int) -> float:
    """FLOPs of one forward+backward over sequences given as their key counts (one list per row)."""
    layers, hidden = MODEL["num_hidden_layers"], MODEL["hidden_size"]
    return float(sum(6 * params * n + 6 * layers * hidden * n * n for row in rows_of_keys for n in row))


def batch_flops(task: str, variant: str, batches: list[list[dict]], params: int) -> float:
    total = 0.0
    for batch in batches:
        if task == "reward":
            seqs = [(len(b["chosen_ids"]), len(b["rejected_ids"])) for b in batch]
            if variant == "trl-padded":
                width = max(max(s) for s in seqs)
                total += flop_model([[width] * 2 * len(seqs)], params)
            elif variant == "padding-free":
                total += flop_model([[n for s in seqs for n in s]], params)
            else:
                from trl_padfree.reward_layout import shared_prefix

                for b in batch:
                    p = shared_prefix(b["chosen_ids"], b["rejected_ids"])
                    c, r = len(b["chosen_ids"]), len(b["rejected_ids"])
                    # chosen segment: c tokens; rejected segment: r - p + 1 queries over r keys
                    layers, hidden = MODEL["num_hidden_layers"], MODEL["hidden_size"]
                    total += 6 * params * (c + r - p + 1) + 6 * layers * hidden * (c * c + (r - p + 1) * r)
        else:
            seqs = [len(b["prompt_ids"]) + len(b["completion_ids"]) for b in batch]
            # each KL sequence is the prompt with the previous example's completion (TRL's rotation in the batch)
            kl = [len(b["prompt_ids"]) + len(batch[i - 1]["completion_ids"]) for i, b in enumerate(batch)]
            # policy: completions forward+backward; KL forward only (1/3); reference: both forward only
            if variant == "trl-padded":
                w, wk = max(seqs), max(kl)
                main, klf = flop_model([[w] * len(seqs)], params), flop_model([[wk] * len(kl)], params)
            else:
                main, klf = flop_model([seqs], params), flop_model([kl], params)
            reference = (main + klf) / 3
            if variant == "prompt-once":  # the reference's KL sequence continues its prompt: p - 1 tokens fewer
                layers, hidden = MODEL["num_hidden_layers"], MODEL["hidden_size"]
                reference = 0.0
                for b, k in zip(batch, kl, strict=True):
                    p, c = len(b["prompt_ids"]), len(b["prompt_ids"]) + len(b["completion_ids"])
                    q = k - p + 1  # KL queries: the last prompt token again and the KL completion, over k keys
                    reference += (6 * params * (c + q) + 6 * layers * hidden * (c * c + q * k)) / 3
            total += main + klf / 3 + reference
    return total


def worker(task: str, variant: str, args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, TrainerCallback

    from trl_padfree import KTOConfig, KTOTrainer, RewardConfig, RewardTrainer
    from trl_padfree.testing import tiny_byte_level_tokenizer

    torch.set_num_threads(args.threads)
    tok = tiny_byte_level_tokenizer()
    rows = dataset(task, args.batch * (args.steps + args.warmup))
    padfree = variant != "trl-padded"
    attn = "padfree" if padfree else "sdpa"
    common = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch, max_steps=args.steps +
                  args.warmup, logging_steps=10_000, report_to="none", save_strategy="no", bf16=False, use_cpu=True,
                  disable_dropout=True, gradient_checkpointing=False, padding_free=padfree, max_length=None,
                  dataloader_num_workers=0)

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, a, state, control, **kw):
            self.ends.append(time.perf_counter())

    torch.manual_seed(0)
    if task == "reward":
        config = LlamaConfig(**MODEL, num_labels=1, pad_token_id=0)
        model = LlamaForSequenceClassification._from_config(config, attn_implementation=attn)
        trainer = RewardTrainer(model, args=RewardConfig(**common), train_dataset=Dataset.from_list(rows),
                                processing_class=tok, prompt_once=variant == "prompt-once",
                                torch_num_threads=None)
    else:
        config = LlamaConfig(**MODEL, pad_token_id=0)
        model = LlamaForCausalLM._from_config(config, attn_implementation=attn)
        ref = LlamaForCausalLM._from_config(config, attn_implementation=attn)
        trainer = KTOTrainer(model, ref, args=KTOConfig(**common), train_dataset=Dataset.from_list(rows),
                             processing_class=tok, prompt_once=variant == "prompt-once", torch_num_threads=None)
    clock = Clock()
    trainer.add_callback(clock)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    timed = clock.ends[-1] - (clock.ends[args.warmup - 1] if args.warmup else start)
    data = trainer.train_dataset
    used = [data[i] for i in range(args.warmup * args.batch, (args.warmup + args.steps) * args.batch)]
    if task == "reward":
        tokens = sum(len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in used)
    else:
        tokens = sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in used)
    params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    batches = [used[i : i + args.batch] for i in range(0, len(used), args.batch)]
    return {"tokens_per_s": tokens / timed, "peak_mib": (peak - before) / 1024, "seconds": timed,
            "flops": batch_flops(task, variant, batches, params)}


def run_variant(args: argparse.Namespace, dataset: None, variant: str, *, isolated: bool = True) -> dict[str, Any]:
    """One variant's whole run, in a worker process (:func:`~.runner.run_variants`)."""
    return worker(args.task, variant, args)


def config_from_dict(values: dict[str, Any]) -> argparse.Namespace:
    return argparse.Namespace(**values)


def add_options(parser: argparse.ArgumentParser, task: str) -> None:
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    add_output(parser, f"output file stem (default: {task}-cpu)")


def main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run every variant ``--rounds`` times, each in its own worker; print the table; 0 when all ran."""
    refuse_unusable(parser, "cpu", args.output_dir)
    env = {"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS[args.task]}
    for _ in range(args.rounds):
        for variant, result in run_variants(sys.modules[__name__], args, list(VARIANTS[args.task]), "sequential",
                                            env=env).items():
            results[variant].append(result)
    base = VARIANTS[args.task][0]
    speed = {v: statistics.median(r["tokens_per_s"] for r in rs) for v, rs in results.items()}
    memory = {v: statistics.median(r["peak_mib"] for r in rs) for v, rs in results.items()}
    flops = {v: rs[0]["flops"] for v, rs in results.items()}
    out = [f"task {args.task}: {args.steps} steps of {args.batch} x {args.rounds} rounds, {args.threads} thread(s), "
           f"load average {os.getloadavg()}",
           f"{'variant':14} {'tokens/s':>10} {'speed ratio':>12} {'FLOP ratio':>11} {'of FLOP':>8} {'peak MiB':>9}"]
    for v in results:
        ratio, fratio = speed[v] / speed[base], flops[base] / flops[v]
        note = "" if v == base else "  " + flop_share_verdict(args.task, ratio / fratio)
        out.append(f"{v:14} {speed[v]:10.0f} {ratio:11.2f}x {fratio:10.2f}x {ratio / fratio:7.0%} {memory[v]:9.0f}{note}")
    print_and_report({"args": vars(args), "variants": results}, args, out)
    return 0
