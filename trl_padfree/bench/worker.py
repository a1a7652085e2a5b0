"""One variant's training run (:class:`VariantRun`): data, model, optimizer, timed steps, peak memory; and the
worker process that runs it (``python -m trl_padfree.bench --worker SPEC``).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from .config import VARIANTS, BenchConfig
from .data import BOS_ID, EOS_ID, IGNORE_INDEX, PAD_ID, TEMPLATE_IDS, make_examples


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


def _targets(batch: dict[str, Any]) -> int:
    """Number of label positions the causal-LM loss averages over (labels shifted by one)."""
    return int((batch["labels"][..., 1:] != IGNORE_INDEX).sum())


class VariantRun:
    """One variant trained on one dataset, one optimizer step at a time.

    Building it makes the data (seeded), the collator, the model (seeded: the same initial weights for every
    variant) and the AdamW optimizer; :meth:`step` trains on the next mini-batch; :meth:`finish` evaluates and
    returns the measurements (a JSON-serialisable dict). ``isolated`` says this process does nothing else (a
    fresh worker), so its lifetime peak RSS is the variant's peak memory; otherwise the peak RSS since the start
    of the run is used (CPU).
    """

    def __init__(self, config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from ..collator import DataCollatorForCompletionOnlyLM

        self.config, self.dataset, self.variant, self.isolated = config, dataset, variant, isolated
        self.spec = spec = VARIANTS[variant]
        if spec.attn_implementation == "padfree":
            from .. import attention  # noqa: F401  (registers "padfree")
        device = torch.device(config.device)
        self.cuda = device.type == "cuda"
        if self.cuda:
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(device)
            torch.cuda.reset_peak_memory_stats(device)
        self.device = device
        if config.threads:
            torch.set_num_threads(config.threads)
        dtype = getattr(torch, config.dtype)

        n_train = config.warmup + config.steps
        common = dict(vocab_size=config.vocab_size, seed=config.seed, min_length=config.min_length,
                      max_length=config.max_length, length_scale=config.length_scale,
                      prompt_fraction=config.prompt_fraction)
        train = make_examples(dataset, n_train * config.batch_size, split="train", **common)
        evaluation = make_examples(dataset, config.eval_batches * config.batch_size, split="eval", **common)
        bs = config.batch_size
        self.train_batches = [train[i * bs : (i + 1) * bs] for i in range(n_train)]
        self.eval_batches = [evaluation[i * bs : (i + 1) * bs] for i in range(config.eval_batches)]
        self.collator = DataCollatorForCompletionOnlyLM(
            list(TEMPLATE_IDS), padding_free=spec.padding_free, on_template_not_found="raise"
        )

        llama = LlamaConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden,
            intermediate_size=config.intermediate,
            num_hidden_layers=config.layers,
            num_attention_heads=config.heads,
            num_key_value_heads=config.kv_heads,
            max_position_embeddings=max(4096, config.max_length),
            pad_token_id=PAD_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            tie_word_embeddings=False,
            use_cache=False,  # as Trainer/SFTTrainer do; the packed batches also carry use_cache=False
        )
        torch.manual_seed(config.seed)  # the same initial weights for every variant (initialised on the CPU)
        model = LlamaForCausalLM._from_config(llama, attn_implementation=spec.attn_implementation, dtype=dtype)
        self.model = model.to(device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr)

        self.start_rss = _current_rss()
        self.rss_reset = not isolated and not self.cuda and _reset_peak_rss()
        self.start_allocated = torch.cuda.memory_allocated(device) if self.cuda else None
        self.losses: list[float] = []
        self.step_seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self.collate_seconds: list[float] = []
        self.real_tokens: list[int] = []
        self.input_tokens: list[int] = []
        self.target_tokens: list[int] = []
        self.optimizer_steps = 0

    @property
    def steps_left(self) -> int:
        return len(self.train_batches) - len(self.step_seconds)

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def step(self) -> dict[str, Any]:
        """Collate the next mini-batch, forward, backward, ``optimizer.step()``; timed (CUDA: synchronised)."""
        if not self.steps_left:
            raise RuntimeError(f"{self.variant}: all {len(self.train_batches)} steps are done")
        examples = self.train_batches[len(self.step_seconds)]
        features = [{"input_ids": ids} for ids in examples]
        self._sync()
        c0, t0 = time.process_time(), time.perf_counter()
        batch = self.collator(features)
        t1 = time.perf_counter()
        batch = self._to_device(batch)
        loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        self._sync()
        t2, c2 = time.perf_counter(), time.process_time()
        self.step_seconds.append(t2 - t0)
        self.cpu_seconds.append(c2 - c0)
        self.collate_seconds.append(t1 - t0)
        self.losses.append(float(loss.detach().float().item()))
        self.real_tokens.append(sum(map(len, examples)))
        self.input_tokens.append(int(batch["input_ids"].numel()))
        self.target_tokens.append(_targets(batch))
        return {"step": len(self.step_seconds), "seconds": t2 - t0, "loss": self.losses[-1]}

    def finish(self) -> dict[str, Any]:
        """Evaluate (token-weighted loss over the eval set) and return every measurement."""
        import torch

        self.model.eval()
        loss_sum, target_sum = 0.0, 0
        with torch.no_grad():
            for examples in self.eval_batches:
                batch = self._to_device(self.collator([{"input_ids": ids} for ids in examples]))
                n = _targets(batch)
                loss_sum += float(self.model(**batch).loss.float().item()) * n
                target_sum += n
        self._sync()

        timed = slice(self.config.warmup, None)
        seconds = sum(self.step_seconds[timed])
        tokens = sum(self.real_tokens[timed])
        result: dict[str, Any] = {
            "dataset": self.dataset,
            "variant": self.variant,
            "attn_implementation": self.spec.attn_implementation,
            "padding_free": self.spec.padding_free,
            "optimizer_steps": self.optimizer_steps,
            "timed_steps": len(self.step_seconds[timed]),
            "warmup_steps": self.config.warmup,
            "train_loss": self.losses,
            "eval_loss": loss_sum / target_sum,
            "eval_target_tokens": target_sum,
            "step_seconds": self.step_seconds,
            "cpu_seconds": self.cpu_seconds,
            "collate_seconds": self.collate_seconds,
            "real_tokens": self.real_tokens,
            "input_tokens": self.input_tokens,
            "target_tokens": self.target_tokens,
            "timed_seconds": seconds,
            "tokens_per_second": tokens / seconds,
            # Host CPU time says little about GPU work: only reported for CPU runs.
            "tokens_per_cpu_second": None if self.cuda else tokens / sum(self.cpu_seconds[timed]),
        }
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            result.update(
                memory_kind="torch.cuda.max_memory_allocated",
                peak_memory_mb=peak / 2**20,
                memory_above_start_mb=(peak - self.start_allocated) / 2**20,
                peak_reserved_mb=torch.cuda.max_memory_reserved(self.device) / 2**20,
            )
        else:
            since = _peak_rss_since_reset() if self.rss_reset else None
            if self.isolated or since is None:
                peak = _process_peak_rss()
                kind = "peak RSS of a fresh worker process" if self.isolated else "peak RSS"
            else:
                peak, kind = since, "peak RSS since the run started (in-process)"
            result.update(
                memory_kind=kind,
                peak_memory_mb=peak / 2**20,
                memory_above_start_mb=None if self.start_rss is None else (peak - self.start_rss) / 2**20,
            )
        return result


def run_variant(config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False) -> dict[str, Any]:
    """Train one variant on one dataset, all steps, and return its measurements (see :class:`VariantRun`)."""
    run = VariantRun(config, dataset, variant, isolated=isolated)
    while run.steps_left:
        run.step()
    return run.finish()


_PROTOCOL = "@@trl-padfree-bench "


def _worker_main(spec_path: str, output_path: str, interactive: bool) -> int:
    """The worker: one variant in this (fresh) process; with ``interactive``, one step per ``step`` line on stdin."""
    spec = json.loads(Path(spec_path).read_text())
    config = BenchConfig.from_dict(spec["config"])
    if not interactive:
        result = run_variant(config, spec["dataset"], spec["variant"], isolated=True)
        Path(output_path).write_text(json.dumps(result))
        return 0
    channel, sys.stdout = sys.stdout, sys.stderr  # only protocol messages go to the parent's pipe

    def send(message: dict[str, Any]) -> None:
        channel.write(_PROTOCOL + json.dumps(message) + "\n")
        channel.flush()

    run = VariantRun(config, spec["dataset"], spec["variant"], isolated=True)
    send({"ready": True})
    for line in sys.stdin:
        command = line.strip()
        if command == "step":
            send(run.step())
        elif command == "finish":
            Path(output_path).write_text(json.dumps(run.finish()))
            send({"done": True})
            return 0
        else:
            raise ValueError(f"unknown worker command {command!r} (expected 'step' or 'finish')")
    return 1  # the parent went away
