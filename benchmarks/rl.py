"""``trl-padfree bench --task grpo|rloo``: the training part of a GRPO or RLOO step, TRL's padded trainer vs padding-free vs prompt-once, side by side.

The training part is what runs after generation and rewards: the no-grad old-policy and reference forwards over the
generation batch (chunks of ``per_device_train_batch_size`` rows, as TRL runs them), then for each micro-batch (TRL's
shuffled split) the policy forward, TRL's loss and the backward. It runs through each trainer's own methods
(``_get_per_token_logps_and_entropies``, ``_compute_loss``) on the SAME recorded generation batches: synthetic
groups with GSM8K-like lengths (completions lognormal, median 300, sigma 0.75, clipped to ``max_completion_length``
1024, prompts ~150, 8 generations per prompt: TRL issue #6263), all lengths multiplied by
``--scale`` for a CPU. The layouts are timed in turns, step after step, in one process; peak memory is the peak RSS
of a fresh process running one step of one layout (Linux: ``VmHWM`` reset just before the step; "step MiB" is
that peak over the RSS before the step).

    OMP_NUM_THREADS=1 trl-padfree bench --task grpo --steps 6 --scale 0.25
    OMP_NUM_THREADS=1 trl-padfree bench --task rloo --steps 6 --scale 0.25

With ``--whole-step`` (grpo only) whole optimizer steps, generation included, next to stock ``trl.GRPOTrainer``:
:mod:`.rl_step`.

Prints per layout: median step seconds, real tokens/s, the speed-up over TRL's padded trainer next to the layout's
FLOP ratio (linear layers and LM head per forwarded token, attention per query-key pair; backward = 2 forwards) and
their quotient, peak memory, and each step's loss side by side; ``os.getloadavg()`` before and after. The figures
and the printed lines go to ``<output-dir>/<name>.json`` and ``.md`` (and ``--json PATH``, a copy of the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

from .cli import add_output
from .report import print_and_report, refuse_unusable
from .runner import run_in_lockstep, run_variants
from .targets import flop_share_verdict

LAYOUTS = ("padded", "padfree", "once")


def lengths(rng: np.random.Generator, groups: int, gens: int, scale: float, max_completion: int) -> tuple:
    prompts = np.clip(np.round(rng.normal(150, 30, groups) * scale), 4, None).astype(int)
    comp = np.exp(rng.normal(np.log(300 * scale), 0.75, (groups, gens)))
    comp = np.clip(np.round(comp), 1, max_completion).astype(int)
    return prompts, comp


def generation_batch(rng: np.random.Generator, args: argparse.Namespace, vocab: int, pad: int) -> dict[str, Any]:
    """One recorded generation batch in TRL's layout: prompts left-padded, completions right-padded, TRL's order
    (a group's rows together), with advantages (group-normalised random rewards)."""
    max_c = int(1024 * args.scale)
    p_len, c_len = lengths(rng, args.groups, args.gens, args.scale, max_c)
    rows = [(g, int(p_len[g]), int(c)) for g in range(args.groups) for c in c_len[g]]
    pw, cw = int(p_len.max()), int(c_len.max())
    prompt_ids = torch.full((len(rows), pw), pad)
    prompt_mask = torch.zeros_like(prompt_ids)
    completion_ids = torch.full((len(rows), cw), pad)
    completion_mask = torch.zeros_like(completion_ids)
    prompt_tokens = [torch.from_numpy(rng.integers(3, vocab, p)) for p in p_len]
    for i, (g, p, c) in enumerate(rows):
        prompt_ids[i, pw - p :] = prompt_tokens[g]
        prompt_mask[i, pw - p :] = 1
        completion_ids[i, :c] = torch.from_numpy(rng.integers(3, vocab, c))
        completion_mask[i, :c] = 1
    rewards = torch.from_numpy(rng.normal(size=(args.groups, args.gens))).float()
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": advantages,
            "perm": torch.from_numpy(rng.permutation(len(rows))), "rows": rows}


def build(layout: str, args: argparse.Namespace, path: str) -> Any:
    import trl

    import trl_padfree

    name = "GRPO" if args.task == "grpo" else "RLOO"
    cls = getattr(trl if layout == "padded" else trl_padfree, f"{name}Trainer")
    attn = "sdpa" if layout == "padded" else "padfree"
    extra = {"loss_type": args.loss_type, "beta": 0.04} if args.task == "grpo" else {}
    config = getattr(trl, f"{name}Config")(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch, num_generations=args.gens,
        gradient_accumulation_steps=args.groups * args.gens // args.batch, num_iterations=2,
        report_to="none", use_cpu=True, bf16=False, max_completion_length=int(1024 * args.scale),
        model_init_kwargs={"attn_implementation": attn, "dtype": "float32"}, **extra,
    )
    from datasets import Dataset
    from transformers import AutoTokenizer

    kw = {} if layout == "padded" else {"padding_free": True, "prompt_once": layout == "once",
                                        "check_packing": False}
    t = cls(path, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=config,
            train_dataset=Dataset.from_list([{"prompt": "x"}] * 8), processing_class=AutoTokenizer.from_pretrained(path), **kw)
    t.model.train()
    t.current_gradient_accumulation_steps = config.gradient_accumulation_steps  # (set by Trainer.train otherwise)
    return t


def training_part(t: Any, batch: dict[str, Any]) -> list[float]:
    """Old + reference log-probs over the generation batch, then each micro-batch's loss and backward."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].shape[1]
    b = t.args.per_device_train_batch_size
    with torch.no_grad():
        old, _, _ = t._get_per_token_logps_and_entropies(t.model, ids, mask, width, batch_size=b)
        ref, _, _ = t._get_per_token_logps_and_entropies(t.ref_model, ids, mask, width, batch_size=b)
    full = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")}
    full.update(old_per_token_logps=old, ref_per_token_logps=ref)
    full["old_logps"] = (old * batch["completion_mask"]).sum(1)  # RLOO's (its reference enters the rewards)
    full["num_items_in_batch"] = batch["completion_mask"].sum()
    perm = batch["perm"]
    losses = []
    for start in range(0, perm.numel(), b):
        take = perm[start : start + b]
        inputs = {k: (v[take] if isinstance(v, torch.Tensor) and v.ndim else v) for k, v in full.items()}
        loss = t._compute_loss(t.model, inputs)
        loss.backward()
        losses.append(loss.item())
    t.model.zero_grad(set_to_none=True)
    return losses


def flops(batch: dict[str, Any], layout: str, cfg: Any, b: int) -> float:
    """Forward-equivalent FLOPs of the training part (2 no-grad forwards + forward and backward = 3 forwards)."""
    d, layers, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    per_token = layers * (2 * d * d + 2 * d * kv + 3 * d * cfg.intermediate_size) + d * v
    rows = batch["rows"]
    pw = batch["prompt_ids"].shape[1]
    cw = batch["completion_ids"].shape[1]

    def chunk(idx: list[int]) -> float:
        if layout == "padded":
            tokens, pairs = len(idx) * (pw + cw), len(idx) * (pw + cw) ** 2 / 2
        else:
            seen, tokens, pairs = set(), 0, 0.0
            for i in idx:
                g, p, c = rows[i]
                if layout == "once" and g in seen:
                    tokens += 1 + c
                    pairs += (1 + c) * (p - 1) + (1 + c) ** 2 / 2
                else:
                    tokens += p + c
                    pairs += (p + c) ** 2 / 2
                seen.add(g)
        return 2 * per_token * tokens + 4 * d * layers * pairs

    order = list(range(len(rows)))
    no_grad = sum(chunk(order[s : s + b]) for s in range(0, len(rows), b))
    perm = batch["perm"].tolist()
    policy = sum(chunk(perm[s : s + b]) for s in range(0, len(rows), b))
    return 2 * no_grad + 3 * policy


def run_variant(args: argparse.Namespace, dataset: None, layout: str, *, isolated: bool = True) -> list[int]:
    """The peak memory of one layout: one step in a fresh worker process (:func:`~.runner.run_variants`), the RSS
    before it and the peak RSS during it, KiB."""
    from .training import _current_rss, _peak_rss_since_reset, _reset_peak_rss

    torch.set_num_threads(args.threads)
    t = build(layout, args, args.model_path)
    batch = generation_batch(np.random.default_rng(args.seed), args, t.model.config.vocab_size, 0)
    before = _current_rss()
    _reset_peak_rss()  # Linux: the peak RSS (VmHWM) starts again at the current RSS
    training_part(t, batch)
    return [before // 1024, _peak_rss_since_reset() // 1024]


def config_from_dict(values: dict[str, Any]) -> argparse.Namespace:
    return argparse.Namespace(**values)


class LayoutRun:
    """One layout's trainer on the recorded generation batches, one step at a time; the first step warms up."""

    def __init__(self, trainer: Any, batches: list[dict[str, Any]]) -> None:
        self.trainer, self.batches, self.total_steps = trainer, batches, len(batches)
        self.times: list[float] = []
        self.losses: list[list[float]] = []
        self.done = 0

    def step(self) -> None:
        start = time.perf_counter()
        out = training_part(self.trainer, self.batches[self.done])
        if self.done:
            self.times.append(time.perf_counter() - start)
            self.losses.append(out)
        self.done += 1

    def finish(self) -> dict[str, Any]:
        return {"times": self.times, "losses": self.losses}


def add_options(parser: argparse.ArgumentParser, task: str) -> None:
    parser.add_argument("--steps", type=int, default=6, help="timed steps per layout (after one warm-up step)")
    parser.add_argument("--scale", type=float, default=0.25, help="multiplies every length (1 = GSM8K-like)")
    parser.add_argument("--groups", type=int, default=4, help="prompts per generation batch")
    parser.add_argument("--gens", type=int, default=8, help="num_generations")
    parser.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--loss-type", default="dapo", help="GRPO's loss_type")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-memory", action="store_true", help="skip the per-layout peak-memory processes")
    parser.add_argument("--json", help="also write the figures to this file")
    add_output(parser, f"output file stem (default: {task}-cpu; grpo-step-cpu with --whole-step)")
    if task == "grpo":
        from .rl_step import add_options as add_whole_step_options

        add_whole_step_options(parser)


def main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``trl-padfree bench --task grpo|rloo``: print the table (:func:`run_rl`, or with ``--whole-step``
    :func:`~.rl_step.run_whole_step`); 0 when it ran."""
    if getattr(args, "whole_step", False):
        from .rl_step import run_whole_step

        run_whole_step(parser, args)
        return 0
    run_rl(parser, args)
    return 0


def run_rl(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """Time every layout in turns, step after step (:func:`~.runner.run_in_lockstep`), print the table and return
    the figures."""
    refuse_unusable(parser, "cpu", args.output_dir)
    torch.set_num_threads(args.threads)
    from transformers import LlamaConfig, LlamaForCausalLM

    from trl_padfree.testing import tiny_byte_level_tokenizer

    load_before = os.getloadavg()
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.6875),
                      num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    path = tempfile.mkdtemp(prefix="bench-rl-")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok = tiny_byte_level_tokenizer()
    tok.save_pretrained(path)
    trainers = {layout: build(layout, args, path) for layout in LAYOUTS}
    rng = np.random.default_rng(args.seed)
    batches = [generation_batch(rng, args, args.vocab, tok.pad_token_id) for _ in range(args.steps + 1)]
    runs = run_in_lockstep([LayoutRun(trainers[layout], batches) for layout in LAYOUTS], rotate=False)
    times = {layout: run["times"] for layout, run in zip(LAYOUTS, runs, strict=True)}
    losses = {layout: run["losses"] for layout, run in zip(LAYOUTS, runs, strict=True)}
    real = [int(b["prompt_mask"].sum() + b["completion_mask"].sum()) for b in batches[1:]]
    result: dict[str, Any] = {"args": vars(args), "load_before": load_before, "layouts": {}}
    base_time = statistics.median(times["padded"])
    base_flops = sum(flops(b, "padded", cfg, args.batch) for b in batches[1:])
    memory = {} if args.no_memory else run_variants(sys.modules[__name__], argparse.Namespace(
        **vars(args), model_path=path), list(LAYOUTS), "sequential")
    for layout in LAYOUTS:
        med = statistics.median(times[layout])
        flop_ratio = base_flops / sum(flops(b, layout, cfg, args.batch) for b in batches[1:])
        entry = {"median_s": med, "tokens_per_s": statistics.median(r / s for r, s in zip(real, times[layout], strict=True)),
                 "speedup": base_time / med, "flop_ratio": flop_ratio, "of_flop_ratio": base_time / med / flop_ratio,
                 "losses": losses[layout]}
        if layout in memory:
            before, peak = memory[layout]
            entry.update(peak_rss_mib=peak / 1024, step_rss_mib=(peak - before) / 1024)
        if layout != "padded":
            totals = trainers[layout].pack_totals
            entry["pack_totals"] = {k: dict(v) for k, v in totals.items()}
        result["layouts"][layout] = entry
    result["load_after"] = os.getloadavg()
    pad_tokens = sum(b["prompt_ids"].numel() + b["completion_ids"].numel() for b in batches[1:])
    what = f"GRPO training part ({args.loss_type}, beta 0.04" if args.task == "grpo" else "RLOO training part (beta 0.05"
    out = [
        f"{what}, old + ref + policy), tiny Llama {args.layers}x{args.hidden} vocab {args.vocab}, fp32, {args.threads} "
        f"thread(s); {args.steps} timed steps of {args.groups} prompts x {args.gens} generations, micro-batch "
        f"{args.batch}; lengths x{args.scale}: real {sum(real)} of {pad_tokens} padded tokens",
        f"load average before {load_before}, after {result['load_after']}",
        f"{'layout':8} {'step s':>8} {'tok/s':>8} {'speed-up':>9} {'FLOP ratio':>10} {'of FLOPs':>9} "
        f"{'peak MiB':>9} {'step MiB':>9}"]
    for layout, e in result["layouts"].items():
        out.append(f"{layout:8} {e['median_s']:8.3f} {e['tokens_per_s']:8.0f} {e['speedup']:8.2f}x "
                   f"{e['flop_ratio']:9.2f}x {e['of_flop_ratio']:8.0%} {e.get('peak_rss_mib', float('nan')):9.0f} "
                   f"{e.get('step_rss_mib', float('nan')):9.0f}")
    for layout, e in result["layouts"].items():
        if layout != "padded":
            e["target"] = flop_share_verdict(args.task, e["of_flop_ratio"])
            out.append(f"{layout}: {e['of_flop_ratio']:.0%} of its FLOP ratio; {e['target']}")
    out.append("per-step mean micro-batch loss (padded / padfree / once):")
    out += ["  " + " / ".join(f"{statistics.mean(losses[k][i]):+.7e}" for k in LAYOUTS) for i in range(args.steps)]
    print_and_report(result, args, out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return result
