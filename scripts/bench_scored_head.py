#!/usr/bin/env python
"""The scored-positions LM head (``trl_padfree.scored_head``) measured against TRL's fused head, CPU, fp32.

Two parts, each printing its figures and ratios side by side, with ``os.getloadavg()``:

- ``bench``: ``trl-padfree bench`` on both workloads (FLAN-like, OrcaMath-like) with ``packed-padfree`` (the bare
  padding-free loop), ``sft-padfree`` (``trl_padfree.SFTTrainer``: the scored head) and ``sft-padfree-trl-head``
  (the same trainer with ``scored_lm_head=False``: TRL's fused head), trained in lockstep, 1 thread. The target is
  ``sft-padfree`` >= 0.95x ``packed-padfree`` in real tokens/s.
- ``qwen``: a randomly initialised Qwen2.5-0.5B-shaped model (hidden 896, 14 heads / 2 kv heads, MLP 4864,
  vocabulary 151,936, tied embeddings) with ``--layers`` decoder layers (default 2 of the real 24, to fit a shared
  CPU), a few SFT steps through ``trl_padfree.SFTTrainer`` with each head, each in a fresh process: median step
  time and peak RSS (and RSS above the start of training).

    OMP_NUM_THREADS=1 python scripts/bench_scored_head.py                       # both parts
    OMP_NUM_THREADS=1 python scripts/bench_scored_head.py --part qwen --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_VARIANTS = ("packed-padfree", "sft-padfree", "sft-padfree-trl-head")


def load() -> str:
    return "load average " + "/".join(f"{x:.2f}" for x in os.getloadavg())


def bench_part(args: argparse.Namespace) -> None:
    out = Path(args.output_dir)
    cmd = [sys.executable, "-m", "benchmarks", "--datasets", "flan,orcamath", "--variants",
           ",".join(BENCH_VARIANTS), "--steps", str(args.bench_steps), "--warmup", "1", "--threads", "1",
           "--output-dir", str(out), "--name", "scored-head"]
    print(f"[bench] {' '.join(cmd[1:])}  ({load()} at start)", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    print(f"[bench] done ({load()}); report {out / 'scored-head.md'}")
    print_bench(json.loads((out / "scored-head.json").read_text()))


def print_bench(report: dict) -> None:
    """The bench part's table and ratios, from the bench's JSON report."""
    print("| workload | variant | LM head | real tokens/s | vs packed-padfree | tokens/CPU-s | vs packed-padfree | "
          "ms/step | peak RSS (MB) | final loss |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, entry in report["datasets"].items():
        runs = entry["variants"]
        base, base_cpu = (runs["packed-padfree"][k] for k in ("tokens_per_second", "tokens_per_cpu_second"))
        for variant in BENCH_VARIANTS:
            r = runs[variant]
            head = r.get("lm_head", "plain: model(**batch).loss over every position")
            print(f"| {name} | {variant} | {head} | {r['tokens_per_second']:,.0f} | "
                  f"{r['tokens_per_second'] / base:.3f}x | {r['tokens_per_cpu_second']:,.0f} | "
                  f"{r['tokens_per_cpu_second'] / base_cpu:.3f}x | {1000 * r['median_step_seconds']:,.0f} | "
                  f"{r['peak_memory_mb']:,.0f} | {r['train_loss'][-1]:.6f} |")
        a, b = runs["sft-padfree"], runs["sft-padfree-trl-head"]
        print(f"[bench] {name}: sft-padfree / sft-padfree-trl-head = "
              f"{a['tokens_per_second'] / b['tokens_per_second']:.3f}x tokens/s; losses equal within "
              f"{max(abs(x - y) / abs(y) for x, y in zip(a['train_loss'], b['train_loss'], strict=True)):.1e} (rel)")


def qwen_worker(head: str, layers: int, steps: int, batch: int, seed: int) -> dict:
    """One run in this process: ``head`` is ``scored`` or ``trl``; returns step times and memory."""
    import random

    import torch
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback
    from trl import SFTConfig

    from trl_padfree import DataCollatorForCompletionOnlyLM, SFTTrainer
    from trl_padfree.testing import tiny_byte_level_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, attn_implementation="padfree")
    model = Qwen2ForCausalLM(config)
    rng = random.Random(seed)
    rows = []
    for _ in range((steps + 1) * batch):  # prompt ~300, completion ~100 tokens: completion-only SFT
        prompt, completion = rng.randint(200, 400), rng.randint(60, 140)
        ids = [rng.randrange(10, 151_936) for _ in range(prompt + completion)]
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = SFTTrainer(
            model=model, processing_class=tiny_byte_level_tokenizer(), train_dataset=Dataset.from_list(rows),
            data_collator=DataCollatorForCompletionOnlyLM(None, padding_free=True),
            args=SFTConfig(output_dir=tmp, per_device_train_batch_size=batch, max_steps=steps + 1, learning_rate=1e-4,
                           logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
                           max_length=None, dataset_kwargs={"skip_prepare_dataset": True}, disable_tqdm=True,
                           activation_checkpointing=False, train_sampling_strategy="sequential", seed=seed),
            check_packing=False, torch_num_threads=None, scored_lm_head=head == "scored", callbacks=[Clock()])
        start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"head": trainer.lm_head_state, "step_seconds": times[1:], "median_step_seconds":
            statistics.median(times[1:]), "peak_rss_mb": peak, "rss_above_start_mb": peak - start_rss,
            "losses": losses, "parameters": sum(p.numel() for p in model.parameters()),
            "tokens_per_step": sum(len(r["input_ids"]) for r in rows) / len(rows) * batch,
            "scored_per_step": sum(sum(x != -100 for x in r["labels"]) for r in rows) / len(rows) * batch}


def qwen_part(args: argparse.Namespace) -> None:
    results = {}
    for head in ("trl", "scored"):
        before = load()
        proc = subprocess.run([sys.executable, __file__, "--worker", head, "--layers", str(args.layers), "--steps",
                               str(args.steps), "--batch", str(args.batch)], check=True, capture_output=True,
                              text=True, cwd=ROOT)
        results[head] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[head]["load"] = f"{before} before, {load()} after"
    trl, ours = results["trl"], results["scored"]
    print(f"[qwen] Qwen2.5-0.5B-shaped, {args.layers} of 24 layers, vocab 151,936, {trl['parameters'] / 1e6:.0f}M "
          f"parameters, fp32, AdamW, batch {args.batch} (~{trl['tokens_per_step']:.0f} tokens/step, "
          f"~{trl['scored_per_step']:.0f} scored), {args.steps} timed steps after 1 warm-up, 1 thread")
    print("| LM head | median step (s) | steps (s) | peak RSS (MB) | RSS above start (MB) | losses | load |")
    print("|---|---:|---|---:|---:|---|---|")
    for r in (trl, ours):
        print(f"| {r['head']} | {r['median_step_seconds']:.2f} | {', '.join(f'{s:.2f}' for s in r['step_seconds'])}"
              f" | {r['peak_rss_mb']:,.0f} | {r['rss_above_start_mb']:,.0f} | "
              f"{', '.join(f'{x:.4f}' for x in r['losses'])} | {r['load']} |")
    print(f"[qwen] scored / TRL: step time {ours['median_step_seconds'] / trl['median_step_seconds']:.2f}x, peak RSS "
          f"{ours['peak_rss_mb'] / trl['peak_rss_mb']:.2f}x, RSS above start "
          f"{ours['rss_above_start_mb'] / trl['rss_above_start_mb']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("bench", "qwen", "both"), default="both")
    p.add_argument("--bench-steps", type=int, default=6, help="timed steps per bench variant (default 6)")
    p.add_argument("--output-dir", default="bench-results", help="where the bench report goes")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the Qwen-shaped model (default 2)")
    p.add_argument("--steps", type=int, default=3, help="timed SFT steps of the Qwen-shaped model (default 3)")
    p.add_argument("--batch", type=int, default=4, help="examples per step of the Qwen-shaped model (default 4)")
    p.add_argument("--worker", choices=("scored", "trl"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(qwen_worker(args.worker, args.layers, args.steps, args.batch, seed=0)))
        return 0
    if args.part in ("bench", "both"):
        bench_part(args)
    if args.part in ("qwen", "both"):
        qwen_part(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
