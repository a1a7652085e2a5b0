"""Padded vs padding-free SFT of a hybrid model: a Qwen3.5-like text model (``qwen3_5_text``, built from a config,
random init) whose layers are gated-delta-rule linear attention (a short convolution, then the chunked delta rule)
and full attention, 3:1 by default (``full_attention_interval`` 4, as Qwen3.5 and Qwen3-Next).

The same examples, mini-batches, steps and seeded weights as ``--task sft`` (its data, collator and loop,
:class:`~.sft_run.VariantRun`), on this model: ``padded-sdpa`` (the baseline), ``packed-padfree`` (one packed row,
``"padfree"``: the recurrent layers restart at every example boundary through ``trl_padfree.recurrent``) and, opt in,
``packed-sdpa``. Prints, per dataset, each layout's real tokens/s, the ratio over padded, the workload's FLOP ratio
(:func:`~.flops.hybrid_forward_flops`: a linear-attention layer costs the tokens it is given, linear in the length, a
full-attention layer the query-key pairs), the measured ratio's share of it (target: >= 85%, judged on the CPU setup
of :data:`~.targets.TARGETS`) and the largest relative train-loss difference over padded (target: 1e-5 in float32).

    OMP_NUM_THREADS=1 trl-padfree bench --task hybrid --threads 1
    trl-padfree bench --task hybrid --datasets flan,orcamath --steps 8
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from . import sft
from .config import VARIANTS, BenchConfig
from .data import BOS_ID, DATASETS, EOS_ID, PAD_ID
from .flops import chunked_slots
from .report import fmt, new_report, print_and_report, refuse_unusable
from .runner import load_average, run_variants
from .sft_report import compare
from .targets import TARGETS, in_speed_setup, share_target, verdict

BASELINE = "padded-sdpa"
HYBRID_VARIANTS = {name: VARIANTS[name] for name in ("padded-sdpa", "packed-sdpa", "packed-padfree")}
"""The loop variants this task runs (the trainer variants are ``--task sft``'s)."""
CHUNK = 64  # transformers' torch_chunk_gated_delta_rule's default chunk_size (Qwen3.5 calls it with the default)


@dataclass
class HybridConfig(BenchConfig):
    """:class:`~.config.BenchConfig` on a ``qwen3_5_text`` model: ``layers`` decoder layers, every
    ``full_attention_interval``-th full attention (``heads`` / ``kv_heads`` of ``hidden // heads``), the others
    gated delta rule (``linear_key_heads`` / ``linear_value_heads`` of ``linear_key_head_dim`` /
    ``linear_value_head_dim``, a ``conv_kernel``-tap convolution).

    >>> c = HybridConfig()
    >>> c.layer_types(), c.parameter_count()
    (['linear_attention', 'linear_attention', 'linear_attention', 'full_attention'], 4231632)
    """

    VARIANTS: ClassVar[dict[str, Any]] = HYBRID_VARIANTS
    KIND: ClassVar[str] = "hybrid "

    variants: list[str] = dataclasses.field(default_factory=lambda: ["padded-sdpa", "packed-padfree"])
    datasets: list[str] = dataclasses.field(default_factory=lambda: ["flan"])
    steps: int = 5
    full_attention_interval: int = 4
    linear_key_heads: int = 4
    linear_value_heads: int = 8
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    conv_kernel: int = 4

    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                for i in range(self.layers)]

    def shape(self) -> dict[str, int]:
        """The sizes :func:`~.flops.hybrid_forward_flops` needs beyond the config's fields."""
        return {"linear_layers": self.layer_types().count("linear_attention"), "head_dim": self.hidden // self.heads,
                "chunk_size": CHUNK}

    def transformers_config(self, positions: int | None = None):
        """The ``Qwen3_5TextConfig`` (what :func:`~.training.build_model` builds)."""
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, layer_types=self.layer_types(), num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, head_dim=self.hidden // self.heads,
            linear_num_key_heads=self.linear_key_heads, linear_num_value_heads=self.linear_value_heads,
            linear_key_head_dim=self.linear_key_head_dim, linear_value_head_dim=self.linear_value_head_dim,
            linear_conv_kernel_dim=self.conv_kernel, max_position_embeddings=max(4096, positions or self.max_length),
            pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=False,
            use_cache=False,
        )

    def parameter_count(self) -> int:
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.transformers_config())
        return sum(p.numel() for p in model.parameters())

    def validate(self) -> None:
        super().validate()
        if self.full_attention_interval < 1:
            raise ValueError(f"--full-attention-interval must be >= 1, got {self.full_attention_interval}")
        if self.linear_value_heads % self.linear_key_heads:
            raise ValueError(f"linear_value_heads ({self.linear_value_heads}) must be a multiple of linear_key_heads "
                             f"({self.linear_key_heads})")
        if BASELINE not in self.variants:
            raise ValueError(f"--variants must include the baseline {BASELINE} (the ratios are over it)")


def unavailable() -> str | None:
    """Why this task cannot run with the installed transformers (no ``qwen3_5_text``), or None."""
    from transformers import CONFIG_MAPPING

    if "qwen3_5_text" not in CONFIG_MAPPING:
        return "this transformers has no qwen3_5_text model (Qwen3.5 needs transformers >= 5.2); upgrade transformers"
    return None


def make_run(config: HybridConfig, dataset: str, variant: str, *, isolated: bool = False):
    """The loop run of ``variant`` on the hybrid model; each step's workload also records the delta rule's chunked
    token slots (:func:`~.flops.chunked_slots`)."""
    from trl_padfree.recurrent import prepare_packed_layers

    from .sft_run import VariantRun

    class Run(VariantRun):
        def step(self) -> dict[str, Any]:
            examples = self.train_batches[len(self.records.step_seconds)]
            out = super().step()
            work = self.records.workloads[-1]
            if self.spec.padding_free:
                work["chunk_slots"] = chunked_slots([len(e) for e in examples], CHUNK)
            else:  # one call over the padded rows
                work["chunk_slots"] = len(examples) * chunked_slots([work["slots"] // len(examples)], CHUNK)
            return out

    run = Run(config, dataset, variant, isolated=isolated)
    prepare_packed_layers(run.model)  # as this package's trainers do (any attention)
    return run


def config_from_dict(values: dict[str, Any]) -> HybridConfig:
    return HybridConfig.from_dict(values)


def add_options(p: argparse.ArgumentParser, task: str) -> None:
    sft.add_options(p, task)
    d = HybridConfig()
    p.add_argument("--full-attention-interval", type=int, default=d.full_attention_interval,
                   help="every N-th layer is full attention, the others gated delta rule (4: 3 linear to 1 full)")
    p.set_defaults(variants=",".join(d.variants), datasets=",".join(d.datasets), steps=d.steps)
    for action in p._actions:
        if action.dest == "variants":
            action.help = f"comma list of {', '.join(HYBRID_VARIANTS)} (must include {BASELINE})"


def config_from_args(args: argparse.Namespace) -> HybridConfig:
    return HybridConfig(
        **BenchConfig.values(args), datasets=args.datasets, eval_batches=args.eval_batches,
        min_length=args.min_length, prompt_fraction=args.prompt_fraction, repeats=1, schedule=args.schedule,
        full_attention_interval=args.full_attention_interval,
    )


def evaluate_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per dataset and padding-free variant: real tokens/s over padded >= 85% of the FLOP ratio (judged in the setup
    of ``TARGETS["hybrid"]``), and every train loss equal to padded's (relative ``loss_rtol``)."""
    config, targets = report["config"], []
    in_setup = in_speed_setup("hybrid", config)
    for dataset, entry in report["datasets"].items():
        for variant, cmp in entry["comparison"].items():
            if variant == BASELINE:
                continue
            targets.append(share_target(
                f"{dataset}: {variant} real tokens/s over {BASELINE} >= {TARGETS['hybrid']['flop_share']:.0%} of the "
                "workload's FLOP ratio", "hybrid", cmp["throughput_ratio"], cmp["flop_ratio"], in_setup))
            diff = cmp["train_loss_max_rel_diff"]
            targets.append({"target": f"{dataset}: {variant} train losses equal {BASELINE}'s (relative "
                                      f"{config['loss_rtol']:g})", "value": diff,
                            "shown": f"max relative difference {diff:.2e}", "holds": diff <= config["loss_rtol"]})
    return targets


def run_benchmark(config: HybridConfig, log=print) -> tuple[dict[str, Any], list[str]]:
    """Run every (dataset, variant) pair; the report and its printed lines."""
    config.validate()
    report = new_report("trl-padfree: padded vs padding-free SFT of a hybrid (gated delta rule + attention) model",
                        config, loss_rtol=config.effective_loss_rtol, **config.shape(),
                        layer_types=config.layer_types())
    report["datasets"] = {}
    schedule = config.schedule if config.subprocess else "in-process"
    lines = [f"Qwen3.5-like hybrid ({config.transformers_config().model_type}), {config.layers} layers "
             f"({' '.join('L' if t == 'linear_attention' else 'A' for t in config.layer_types())}: L gated delta "
             f"rule, A full attention) x {config.hidden}, {report['config']['parameters']:,} parameters, "
             f"{config.dtype} on {config.device}, {config.threads or 'default'} torch thread{'' if config.threads == 1 else 's'} per worker, batch "
             f"{config.batch_size}, {config.warmup} warm-up + {config.steps} timed steps, {schedule}"]
    for dataset in config.datasets:
        stats = config.length_stats(dataset)
        started = time.perf_counter()
        results = run_variants(sys.modules[__name__], config, config.variants, schedule, dataset)
        wall = time.perf_counter() - started
        ordered = {name: results[name] for name in config.variants}
        comparison = compare(ordered, report["config"])
        report["datasets"][dataset] = {"label": DATASETS[dataset].label, "length_stats": stats, "variants": ordered,
                                       "comparison": comparison}
        base = ordered[BASELINE]
        lines.append(f"\n{DATASETS[dataset].short}: mean length {stats['mean']:.0f}, padding ratio "
                     f"{stats['padding_ratio']:.2f}, {wall:.0f} s")
        lines.append(f"  {'variant':<15} {'real tok/s':>10} {'vs padded':>9} {'FLOP ratio':>10} {'share':>6} "
                     f"{'ms/step':>8} {'loss diff':>9}")
        for name, res in ordered.items():
            cmp = comparison[name]
            share = cmp["share_of_flop_ratio"]
            diff = max(cmp["train_loss_max_rel_diff"], abs(res["eval_loss"] - base["eval_loss"]) / base["eval_loss"])
            lines.append(f"  {name:<15} {res['tokens_per_second']:>10,.0f} {fmt(cmp['throughput_ratio']):>9} "
                         f"{fmt(cmp['flop_ratio']):>10} {'' if share is None else f'{share:.0%}':>6} "
                         f"{res['median_step_seconds'] * 1000:>8,.0f} {diff:>9.1e}")
    report["machine"]["load_average_end"] = load_average()
    report["targets"] = evaluate_targets(report)
    m = report["machine"]
    lines.append(f"\nMachine: {m['cpu']} ({m['cpu_count']} CPUs), torch {m['torch']}, transformers "
                 f"{m['transformers']}; load average {m['load_average_start']} at start, {m['load_average_end']} at end")
    lines.append("Targets:")
    lines += [f"  {dict({True: 'PASS', False: 'FAIL', None: 'n/a'})[t['holds']]}: {t['target']}: {t['shown']}"
              for t in report["targets"]]
    return report, lines


def main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    unused = [flag for flag, value in (("--replot", args.replot), ("--max-tokens", args.max_tokens),
                                       ("--repeats", args.repeats != 1)) if value]
    if unused:
        parser.error(f"{', '.join(unused)}: not an option of --task hybrid (one run of the loop variants); leave "
                     "it out, or use --task sft")
    config = config_from_args(args)
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    reason = unavailable()
    if reason:
        parser.error(reason)
    refuse_unusable(parser, config.device, args.output_dir)
    report, lines = run_benchmark(config, log=lambda *_: None)
    print_and_report(report, args, lines)
    return verdict(report)


__all__ = ["HybridConfig", "add_options", "config_from_dict", "evaluate_targets", "main", "make_run", "run_benchmark"]
