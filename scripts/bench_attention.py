"""Micro-benchmark: padded sdpa vs packed sdpa (dense block mask) vs packed "padfree", same batches.

Trains a tiny Llama from a config (random weights, nothing downloaded) on FLAN-like lengths (lognormal,
median ~340, sigma ~0.8) and reports real (non-padding) tokens per second of forward+backward+optimizer steps.
The three variants run interleaved on the same batches, so drift of a shared CPU hits them alike. Besides
wall-clock tokens/s the script prints tokens per CPU-second of this process (``time.process_time``), which is
far less sensitive to other processes competing for the cores.

    python scripts/bench_attention.py                 # defaults of the issue's target (CPU, fp32)
    python scripts/bench_attention.py --steps 10 --repeats 2
    python scripts/bench_attention.py --threads 1     # on a CPU shared with other processes

Measured on the 2-core development machine while shared (1 thread, 5 steps, seeds 0/1/2): padded sdpa
257-498 tok/s, packed sdpa 357-744, packed padfree 1,045-1,843; padfree / padded sdpa 3.6-4.1x,
padfree / packed sdpa 2.4-2.9x (tokens per CPU-second give the same ratios within a few percent).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import trl_padfree.attention  # noqa: E402,F401  (registers "padfree")

VARIANTS = ("padded+sdpa", "packed+sdpa", "packed+padfree")


def sample_lengths(
    generator: torch.Generator, n: int, median: float, sigma: float, min_len: int, max_len: int
) -> list[int]:
    normal = torch.randn(n, generator=generator, dtype=torch.float64)
    lengths = torch.exp(math.log(median) + sigma * normal).round().long().clamp(min_len, max_len)
    return lengths.tolist()


def make_batches(args: argparse.Namespace) -> list[list[list[int]]]:
    generator = torch.Generator().manual_seed(args.seed)
    batches = []
    for _ in range(args.warmup + args.steps):
        lengths = sample_lengths(
            generator, args.batch_size, args.median, args.sigma, args.min_length, args.max_length
        )
        batches.append([torch.randint(0, args.vocab, (n,), generator=generator).tolist() for n in lengths])
    return batches


def padded_batch(examples: list[list[int]]) -> dict:
    longest = max(map(len, examples))
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, : len(example)] = torch.tensor(example)
        mask[row, : len(example)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "use_cache": False}


def packed_batch(examples: list[list[int]], collator: DataCollatorWithFlattening) -> dict:
    batch = collator([{"input_ids": example} for example in examples])
    batch["use_cache"] = False
    return batch


def build_model(args: argparse.Namespace, attn: str, state: dict | None) -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(4096, args.max_length),
    )
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state)
    model.train()
    return model


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5, help="timed train steps per variant")
    parser.add_argument("--warmup", type=int, default=1, help="untimed train steps per variant")
    parser.add_argument("--repeats", type=int, default=1, help="repeat the whole measurement")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--median", type=float, default=340.0, help="median example length (tokens)")
    parser.add_argument("--sigma", type=float, default=0.8, help="lognormal sigma of example lengths")
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=688)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    batches = make_batches(args)
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    reference = build_model(args, "sdpa", None)
    state = reference.state_dict()
    models = {
        "padded+sdpa": reference,
        "packed+sdpa": build_model(args, "sdpa", state),
        "packed+padfree": build_model(args, "padfree", state),
    }
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
    real_tokens = [sum(map(len, examples)) for examples in batches]
    padded_tokens = [len(examples) * max(map(len, examples)) for examples in batches]
    timed = slice(args.warmup, None)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; Llama {args.layers}x{args.hidden} "
        f"({args.heads} heads / {args.kv_heads} kv), fp32, batch {args.batch_size}, "
        f"lengths lognormal(median {args.median:g}, sigma {args.sigma:g})"
    )
    print(
        f"timed steps {args.steps}: {sum(real_tokens[timed])} real tokens, "
        f"padding ratio {sum(padded_tokens[timed]) / sum(real_tokens[timed]):.2f}"
    )

    results: dict[str, dict[str, list[float]]] = {
        "wall": {n: [] for n in VARIANTS},
        "cpu": {n: [] for n in VARIANTS},
    }
    for repeat in range(args.repeats):
        seconds = {"wall": dict.fromkeys(VARIANTS, 0.0), "cpu": dict.fromkeys(VARIANTS, 0.0)}
        first_losses: dict[str, float] = {}
        for step, examples in enumerate(batches):
            inputs = {
                "padded+sdpa": padded_batch(examples),
                "packed+sdpa": packed_batch(examples, collator),
                "packed+padfree": packed_batch(examples, collator),
            }
            for name in VARIANTS:
                model, optimizer = models[name], optimizers[name]
                start, start_cpu = time.perf_counter(), time.process_time()
                loss = model(**inputs[name]).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
                if step == 0 and repeat == 0:
                    first_losses[name] = loss.item()
                if step >= args.warmup:
                    seconds["wall"][name] += elapsed
                    seconds["cpu"][name] += elapsed_cpu
        if first_losses:
            print("loss of the first batch: " + ", ".join(f"{n} {v:.6f}" for n, v in first_losses.items()))
        tokens = sum(real_tokens[timed])
        for clock, unit in (("wall", "tok/s"), ("cpu", "tok/CPU-s")):
            throughput = {name: tokens / seconds[clock][name] for name in VARIANTS}
            for name in VARIANTS:
                results[clock][name].append(throughput[name])
            print(f"repeat {repeat + 1} ({clock}): {_line(throughput, unit)}")
    summary = {
        clock: {n: statistics.median(v) for n, v in values.items()} for clock, values in results.items()
    }
    if args.repeats > 1:
        print(f"median over {args.repeats} repeats (wall): {_line(summary['wall'], 'tok/s')}")
        print(f"median over {args.repeats} repeats (cpu): {_line(summary['cpu'], 'tok/CPU-s')}")
    return summary


def _line(throughput: dict[str, float], unit: str) -> str:
    values = ", ".join(f"{name} {throughput[name]:,.0f} {unit}" for name in VARIANTS)
    padfree = throughput["packed+padfree"]
    return (
        f"{values}; padfree / padded sdpa {padfree / throughput['padded+sdpa']:.2f}x, "
        f"padfree / packed sdpa {padfree / throughput['packed+sdpa']:.2f}x"
    )


if __name__ == "__main__":
    main()
