"""What every variant's training run shares: device, seeded examples, the seeded model, the optimizer, the
peak-memory meter, the evaluation and the per-step records that become a variant's measurements.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .data import BOS_ID, EOS_ID, IGNORE_INDEX, PAD_ID
from .preset import Preset


def _current_rss() -> int | None:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # pragma: no cover - psutil is a dependency; be tolerant anyway
        return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_rss_since_reset() -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _process_peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def count_targets(batch: dict[str, Any]) -> int:
    """Number of label positions the causal-LM loss averages over (labels shifted by one)."""
    return int((batch["labels"][..., 1:] != IGNORE_INDEX).sum())


def bench_device(config: Preset):
    """The ``torch.device`` of the run (CUDA: made current, peak statistics reset)."""
    import torch

    device = torch.device(config.device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    if config.threads:
        torch.set_num_threads(config.threads)
    return device


def build_model(config: Preset, attn_implementation: str | None, device, positions: int | None = None):
    """The random-init Llama of ``config`` (seeded: the same initial weights for every variant), in train mode.

    ``attn_implementation=None`` leaves the choice to transformers (the model's default, sdpa for Llama);
    ``positions``: the longest row it is built for (default ``config.max_length``; a DPO pair is two parts).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if attn_implementation == "padfree":
        from trl_padfree import attention  # noqa: F401  (registers "padfree")
    if hasattr(config, "transformers_config"):  # another architecture (benchmarks/hybrid.py)
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.seed)
        kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        hf_config = config.transformers_config(positions)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, config.dtype), **kwargs).to(device)
        model.train()
        return model
    llama = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=max(4096, positions or config.max_length),
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        use_cache=False,  # as Trainer/SFTTrainer do; the packed batches also carry use_cache=False
    )
    torch.manual_seed(config.seed)  # the same initial weights for every variant (initialised on the CPU)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = LlamaForCausalLM._from_config(llama, dtype=getattr(torch, config.dtype), **kwargs).to(device)
    model.train()
    return model


def make_optimizer(config: Preset, model):
    """``torch.optim.AdamW(lr=config.lr)`` with torch's defaults (weight decay 0.01), the same in every variant."""
    import torch

    return torch.optim.AdamW(model.parameters(), lr=config.lr)


def to_device(batch: dict[str, Any], device) -> dict[str, Any]:
    import torch

    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def synchronize(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def evaluate(model, collate: Callable[[list[dict[str, Any]]], dict[str, Any]], batches: Sequence[list[dict]],
             device) -> tuple[float, int]:
    """Token-weighted mean loss of ``model(**batch).loss`` over the eval batches (features per batch), and the
    number of loss targets."""
    import torch

    model.eval()
    loss_sum, target_sum = 0.0, 0
    with torch.no_grad():
        for features in batches:
            batch = to_device({**collate(features), "use_cache": False}, device)
            n = count_targets(batch)
            loss_sum += float(model(**batch).loss.float().item()) * n
            target_sum += n
    synchronize(device)
    return loss_sum / target_sum, target_sum


class MemoryMeter:
    """Peak memory of a run: CUDA ``max_memory_allocated``; on CPU the peak RSS of the process (``isolated``: a
    fresh worker that does nothing else) or, in-process, the peak RSS since :meth:`start` (kernel mark reset)."""

    def __init__(self, device, isolated: bool):
        self.device, self.isolated = device, isolated
        self.cuda = device.type == "cuda"

    def start(self) -> None:
        import torch

        self.start_rss = _current_rss()
        self.rss_reset = not self.isolated and not self.cuda and _reset_peak_rss()
        self.start_allocated = torch.cuda.memory_allocated(self.device) if self.cuda else None

    def result(self) -> dict[str, Any]:
        import torch

        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            return dict(
                memory_kind="torch.cuda.max_memory_allocated",
                peak_memory_mb=peak / 2**20,
                memory_above_start_mb=(peak - self.start_allocated) / 2**20,
                peak_reserved_mb=torch.cuda.max_memory_reserved(self.device) / 2**20,
            )
        since = _peak_rss_since_reset() if self.rss_reset else None
        if self.isolated or since is None:
            peak = _process_peak_rss()
            kind = "peak RSS of a fresh worker process" if self.isolated else "peak RSS"
        else:
            peak, kind = since, "peak RSS since the run started (in-process)"
        return dict(
            memory_kind=kind,
            peak_memory_mb=peak / 2**20,
            memory_above_start_mb=None if self.start_rss is None else (peak - self.start_rss) / 2**20,
        )


class StepRecords:
    """Per-step records of a run and the measurements made from them (the timed steps follow the warm-up)."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.losses: list[float] = []
        self.step_seconds: list[float] = []  # wall time of the whole step (collation ... optimizer, logging)
        self.cpu_seconds: list[float] = []
        self.compute_seconds: list[float] = []  # forward + backward + optimizer step only
        self.real_tokens: list[int] = []
        self.input_tokens: list[int] = []
        self.target_tokens: list[int] = []
        self.fingerprints: list[str] = []
        self.workloads: list[dict[str, int]] = []  # what each step's batch computes (:mod:`.flops`)

    def summary(self, cuda: bool) -> dict[str, Any]:
        timed = slice(self.warmup, None)
        seconds = sum(self.step_seconds[timed])
        tokens = sum(self.real_tokens[timed])
        overhead = [s - c for s, c in zip(self.step_seconds, self.compute_seconds, strict=True)]
        return {
            "optimizer_steps": len(self.step_seconds),
            "timed_steps": len(self.step_seconds[timed]),
            "warmup_steps": self.warmup,
            "train_loss": self.losses,
            "step_seconds": self.step_seconds,
            "cpu_seconds": self.cpu_seconds,
            "compute_seconds": self.compute_seconds,
            "overhead_seconds": overhead,
            "real_tokens": self.real_tokens,
            "input_tokens": self.input_tokens,
            "target_tokens": self.target_tokens,
            "batch_fingerprints": self.fingerprints,
            "workloads": self.workloads,
            "timed_seconds": seconds,
            "tokens_per_second": tokens / seconds,
            "median_step_seconds": _median(self.step_seconds[timed]),
            "median_overhead_seconds": _median(overhead[timed]),
            # Host CPU time says little about GPU work: only reported for CPU runs.
            "tokens_per_cpu_second": None if cuda else tokens / sum(self.cpu_seconds[timed]),
        }


def _median(values: Sequence[float]) -> float:
    """
    >>> _median([3.0, 1.0, 2.0]), _median([1.0, 2.0])
    (2.0, 1.5)
    """
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
