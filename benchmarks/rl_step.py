"""``trl-padfree bench --task grpo --whole-step``: whole GRPO optimizer steps, generation included, stock
``trl.GRPOTrainer`` (padded, sdpa) next to this package's padding-free and prompt-once ``GRPOTrainer``.

Each layout's trainer runs its own ``Trainer.train()`` loop, one optimizer step per turn, the layouts in lockstep in
one process (step i of each, then step i+1: :mod:`.stepped`, :func:`~.runner.run_in_lockstep`), so the load of a
shared machine hits them alike. A step is one generation batch (``--groups`` prompts x ``--gens`` completions, one
micro-batch): generation (TRL's ``_generate``: transformers' ``generate`` on the padded prompts, then decoding),
rewards and advantages, the policy forward and backward, the optimizer step (TRL's default ``beta`` 0.0, so no
reference model, and SGD: three trainers of a 135M model in one process fit in a few GB).
Generation is timed inside the step, so the report gives per layout the median whole step, its generation seconds
and share, and the rest (what padding-free changes). The model is a random-init Llama of ``--model-size``
(``smollm2-135m``: the real model's shape, :mod:`.preset`) with a word-level tokenizer over its whole vocabulary;
prompts are words of ids drawn at random, their lengths normal(``--prompt-mean``, a quarter of it). Every
completion is ``--completion`` tokens long (``min_new_tokens``: a random-init model has no reason to stop), so the
layouts compute the same number of real tokens; their sampled tokens differ (the trainers share one random
generator), so their losses are not compared.

    OMP_NUM_THREADS=2 trl-padfree bench --task grpo --whole-step --model-size smollm2-135m --steps 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch

from .preset import MODEL_PRESETS
from .report import print_and_report
from .runner import run_in_lockstep
from .stepped import SteppedTrainerRun, bench_trainer_class

LAYOUTS = ("padded", "padfree", "once")


def save_model(args: argparse.Namespace, path: str) -> dict[str, int]:
    """The random-init Llama of ``--model-size`` and the word-level tokenizer over its vocabulary, saved in
    ``path``; returns the model's shape."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from .data import BOS_ID, EOS_ID, PAD_ID, bench_tokenizer

    shape = dict(MODEL_PRESETS[args.model_size])
    config = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden"],
                         intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                         max_position_embeddings=4096, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
                         eos_token_id=EOS_ID, tie_word_embeddings=args.model_size == "smollm2-135m")
    torch.manual_seed(args.seed)
    LlamaForCausalLM(config).save_pretrained(path)
    bench_tokenizer(shape["vocab_size"]).save_pretrained(path)
    return shape


def prompts(args: argparse.Namespace, vocab: int, n: int) -> list[dict[str, str]]:
    """``n`` prompts of words standing for random ids, lengths normal(``--prompt-mean``, a quarter of it)."""
    from .data import token_text

    rng = np.random.default_rng(args.seed)
    lengths = np.clip(np.round(rng.normal(args.prompt_mean, args.prompt_mean / 4, n)), 4, None).astype(int)
    return [{"prompt": " ".join(token_text(int(i)) for i in rng.integers(8, vocab, k))} for k in lengths]


class GRPOStepRun(SteppedTrainerRun):
    """One layout's GRPO trainer, one whole optimizer step (generation included) per :meth:`step`."""

    trainer_name = "GRPOTrainer"

    def __init__(self, args: argparse.Namespace, layout: str, path: str, data: list[dict[str, str]]) -> None:
        import datasets
        import trl

        import trl_padfree

        config = argparse.Namespace(device="cpu", warmup=args.warmup, seed=args.seed, threads=args.threads)
        self._setup(config, layout, None, args.warmup + args.steps)
        rows = args.groups * args.gens
        grpo = trl.GRPOConfig(
            output_dir=self._tmp.name, per_device_train_batch_size=rows, num_generations=args.gens,
            gradient_accumulation_steps=1, num_iterations=1, max_steps=self.total_steps,
            max_completion_length=args.completion, beta=0.0, loss_type=args.loss_type, learning_rate=1e-5,
            optim="sgd",  # TRL's default beta 0.0 (no reference model) and SGD: three trainers fit in one process
            logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=args.seed,
            disable_tqdm=True, activation_checkpointing=False, shuffle_dataset=False,
            generation_kwargs={"min_new_tokens": args.completion},  # every completion --completion tokens long
            model_init_kwargs={"attn_implementation": "sdpa" if layout == "padded" else "padfree",
                               "dtype": "float32"},
        )
        base = trl.GRPOTrainer if layout == "padded" else trl_padfree.GRPOTrainer
        extra = {} if layout == "padded" else {"padding_free": True, "prompt_once": layout == "once",
                                               "check_packing": False, "torch_num_threads": None}
        from transformers import AutoTokenizer

        trainer = self._build_quietly(lambda: bench_trainer_class(base)(
            path, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions], args=grpo,
            train_dataset=datasets.Dataset.from_list(data), processing_class=AutoTokenizer.from_pretrained(path),
            **extra))
        self.generation_seconds: list[float] = []
        generate = trainer._generate

        def timed_generate(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            out = generate(*a, **k)
            self.generation_seconds.append(time.perf_counter() - start)
            return out

        trainer._generate = timed_generate
        self._seen = 0
        self._start(trainer, trainer.model, isolated=False)

    def _observe(self, inputs: Any) -> None:
        rec = self.records
        rec.fingerprints.append(str(hash(tuple(row["prompt"] for row in inputs))))
        # the step's real tokens (prompts + completions) are known after it: counted in finish()

    def finish(self) -> dict[str, Any]:
        self._finished()
        steps = self.records.step_seconds
        seen = [e["num_tokens"] for e in self.logged]  # cumulative prompt + completion tokens
        tokens = [b - a for a, b in zip([0.0, *seen[:-1]], seen, strict=True)]
        timed = slice(self.config.warmup, None)
        gen = self.generation_seconds
        self._tmp.cleanup()
        if len(gen) != len(steps):
            raise RuntimeError(f"{self.variant}: {len(gen)} generations in {len(steps)} steps; expected one per step")
        return {"step_seconds": steps, "generation_seconds": gen, "real_tokens": tokens,
                "median_step_s": statistics.median(steps[timed]),
                "median_generation_s": statistics.median(gen[timed]),
                "median_rest_s": statistics.median(s - g for s, g in zip(steps[timed], gen[timed], strict=True)),
                "completion_mean_length": statistics.mean(e["completions/mean_length"] for e in self.logged),
                "warnings": self.trainer_warnings}


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options only ``--whole-step`` reads (the others are :mod:`.rl`'s)."""
    parser.add_argument("--whole-step", action="store_true",
                        help="whole optimizer steps with generation, next to stock trl.GRPOTrainer (grpo only)")
    parser.add_argument("--model-size", choices=list(MODEL_PRESETS), default="smollm2-135m",
                        help="--whole-step: the random-init Llama's shape")
    parser.add_argument("--completion", type=int, default=32, help="--whole-step: max_completion_length")
    parser.add_argument("--prompt-mean", type=int, default=48, help="--whole-step: mean prompt length, tokens")
    parser.add_argument("--warmup", type=int, default=1, help="--whole-step: untimed steps first")


def run_whole_step(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """Train every layout ``--warmup`` + ``--steps`` whole steps in lockstep; print and write the report."""
    if args.task != "grpo":
        parser.error("--whole-step is for --task grpo")
    for name in ("steps", "groups", "gens", "completion", "prompt_mean"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    path = tempfile.mkdtemp(prefix="bench-grpo-step-")
    shape = save_model(args, path)
    data = prompts(args, shape["vocab_size"], args.groups * (args.warmup + args.steps))
    runs = [GRPOStepRun(args, layout, path, data) for layout in LAYOUTS]
    results = dict(zip(LAYOUTS, run_in_lockstep(runs, rotate=True), strict=True))
    base = results["padded"]["median_step_s"]
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "shape": shape,
                              "load_before": load_before, "load_after": os.getloadavg(), "layouts": results}
    out = [
        f"GRPO whole step ({args.loss_type}, beta 0 (TRL's default), SGD, generation included), random-init Llama {args.model_size} "
        f"({shape['layers']} x {shape['hidden']}, {shape['heads']}/{shape['kv_heads']} heads, vocab "
        f"{shape['vocab_size']}), fp32, {args.threads} thread(s); {args.steps} timed steps (+{args.warmup} warm-up) "
        f"of {args.groups} prompts x {args.gens} completions of {args.completion} tokens, prompts ~{args.prompt_mean}",
        f"load average before {load_before}, after {result['load_after']}",
        f"{'layout':8} {'step s':>8} {'generation s':>13} {'share':>6} {'rest s':>8} {'step vs TRL':>12} "
        f"{'rest vs TRL':>12} {'completion':>11}"]
    for layout, r in results.items():
        out.append(f"{layout:8} {r['median_step_s']:8.2f} {r['median_generation_s']:13.2f} "
                   f"{r['median_generation_s'] / r['median_step_s']:6.0%} {r['median_rest_s']:8.2f} "
                   f"{base / r['median_step_s']:11.2f}x {results['padded']['median_rest_s'] / r['median_rest_s']:11.2f}x "
                   f"{r['completion_mean_length']:11.1f}")
    out.append("padded: stock trl.GRPOTrainer (sdpa); padfree / once: trl_padfree.GRPOTrainer (\"padfree\"), "
               "prompt_once False / True; rest = the step without generation")
    if args.name is None:
        args.name = "grpo-step-cpu"
    print_and_report(result, args, out)
    return result
