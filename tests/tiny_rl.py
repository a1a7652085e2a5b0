"""Shared set-up of the GRPO/RLOO tests: a tiny Llama that stops at every 9th token id (uneven completions), prompts,
a reward, and recording trainers of TRL's padded and this package's padding-free and prompt-once layouts."""

from __future__ import annotations

import random
import re
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import trl
from datasets import Dataset
from layout_runs import GradRecorder, step_logs
from trl import GRPOConfig, RLOOConfig

import trl_padfree
from trl_padfree.testing import demo_corpus, tiny_byte_level_tokenizer, tiny_llama

RTOL = 1e-5  # log-probs, entropies, gradients: max |diff| / max |TRL's|, per tensor
METRIC_RTOL, METRIC_FLOOR = 1e-5, 1e-6  # logged metrics: |diff| <= 1e-5 |TRL's| + 1e-6
STOP_EVERY = 9  # every 9th token id ends a completion: lengths spread over 1..max_completion_length


def grpo_loss_types() -> list[str]:
    """The loss types the installed TRL's ``GRPOConfig`` names in its ``loss_type`` help (not a list kept here)."""
    field = GRPOConfig.__dataclass_fields__["loss_type"]
    text = field.metadata["help"].split("Supported values are", 1)[1].split(". ", 1)[0]
    found = re.findall(r"'(\w+)'", text)
    assert found, f"cannot read the loss types from GRPOConfig's help: {text!r}"
    return found


def tokenizer() -> Any:
    return tiny_byte_level_tokenizer()


def prompts(n: int = 8, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    corpus = demo_corpus(100, seed)
    rows = [{"prompt": "Q: " + " ".join(rng.choice(corpus)[:rng.randint(4, 40)] for _ in range(rng.randint(1, 2)))
             + "\nA:"} for _ in range(n)]
    return Dataset.from_list(rows)


def reward_letters(completions: list[str], **kwargs: Any) -> list[float]:
    """Distinct letters in the completion, a tenth each (uneven within a group, so advantages are not 0)."""
    return [len({ch for ch in c if ch.isalpha()}) / 10 for c in completions]


_SAVED: dict[Any, str] = {}


def model_path(seed: int = 0, build: Callable[[], Any] | None = None, key: str = "llama") -> str:
    """A saved tiny Llama, or ``build()``'s model (once per ``key``), stopping at :data:`STOP_EVERY`."""
    if (key, seed) not in _SAVED:
        m = tiny_llama(seed=seed) if build is None else build()
        tok = tokenizer()
        m.generation_config.eos_token_id = sorted({tok.eos_token_id, *range(3, m.config.vocab_size, STOP_EVERY)})
        m.generation_config.pad_token_id = tok.pad_token_id
        path = tempfile.mkdtemp(prefix=f"tiny-rl-{key}-")
        m.save_pretrained(path)  # (under torchrun: before the process group exists, or only rank 0 writes)
        tok.save_pretrained(path)
        _SAVED[(key, seed)] = path
    return _SAVED[(key, seed)]


def attn(layout: str) -> str:
    return "padfree" if layout in ("padfree", "once") else "sdpa"


COMMON: dict[str, Any] = dict(
    per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2, max_steps=3,
    max_completion_length=10, learning_rate=0.05, optim="sgd", logging_steps=1, report_to="none", save_strategy="no",
    bf16=False, use_cpu=True, seed=0, dataloader_num_workers=0, num_iterations=2,
)


def config(kind: str, out: str, layout: str, **overrides: Any) -> GRPOConfig | RLOOConfig:
    """TRL's config of ``kind`` (GRPO with beta 0.1: a reference model) for ``layout``."""
    init = {"attn_implementation": attn(layout), "dtype": "float32", **overrides.pop("model_init_kwargs", {})}
    cls, own = (GRPOConfig, {"beta": 0.1}) if kind == "grpo" else (RLOOConfig, {})
    return cls(output_dir=out, model_init_kwargs=init, **{**COMMON, **own, **overrides})


class RecordingLogps:
    """Keeps what ``_get_per_token_logps_and_entropies`` hands TRL's code (log-probs, entropies), call by call."""

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if not hasattr(self, "recorded"):
            self.recorded = []
        self.recorded.append(tuple(None if t is None else t.detach().clone() for t in out[:2]))
        return out


def _classes(kind: str, layout: str) -> type:
    base = getattr(trl if layout == "padded" else trl_padfree, "GRPOTrainer" if kind == "grpo" else "RLOOTrainer")
    return type(f"Recording{base.__name__}", (RecordingLogps, base), {})


def trainer(kind: str, layout: str, out: str, *, data: Dataset | None = None, peft: Any = None,
            check_packing: bool = True, scored_lm_head: bool | None = None, model: str | None = None,
            **overrides: Any) -> Any:
    """A recording GRPO/RLOO trainer of ``layout`` on the saved ``model`` (TRL loads its reference)."""
    tok = tokenizer()
    args = config(kind, out, layout, **overrides)
    kwargs: dict[str, Any] = {}
    if layout == "trl_padfree(padding_free=False)":
        kwargs = dict(padding_free=False)
    elif layout != "padded":
        kwargs = dict(padding_free=True, prompt_once=layout == "once", check_packing=check_packing)
    if scored_lm_head is not None:  # (None: the trainer's default)
        kwargs["scored_lm_head"] = scored_lm_head
    recorder = GradRecorder()
    t = _classes(kind, layout)(model or model_path(), reward_funcs=reward_letters, args=args,
                               train_dataset=data if data is not None else prompts(), processing_class=tok,
                               peft_config=peft, callbacks=[recorder], **kwargs)
    t.recorder = recorder
    return t


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b| relative to max |b| (0 for two zero tensors)."""
    scale = b.abs().max().clamp_min(1e-30)
    return ((a - b).abs().max() / scale).item() if b.numel() else 0.0


# not compared between runs: wall-clock figures and the schedule's bookkeeping
TIMED = ("step_time", "real_tokens_per_second", "generation_seconds", "generation_share", "learning_rate", "epoch",
         "step")


def compare(got: Any, want: Any) -> dict[str, float]:
    """The worst relative difference of each thing recorded: log-probs, entropies, logged metrics, gradients."""
    assert len(got.recorded) == len(want.recorded), (len(got.recorded), len(want.recorded))
    out = {"logps": 0.0, "entropy": 0.0, "metrics": 0.0, "grads": 0.0}
    for (g_lp, g_ent), (w_lp, w_ent) in zip(got.recorded, want.recorded, strict=True):
        assert g_lp.shape == w_lp.shape
        out["logps"] = max(out["logps"], rel(g_lp, w_lp))
        assert (g_ent is None) == (w_ent is None)
        if w_ent is not None:
            out["entropy"] = max(out["entropy"], rel(g_ent, w_ent))
    g_logs, w_logs = step_logs(got), step_logs(want)
    assert len(g_logs) == len(w_logs) == got.args.max_steps
    for g, w in zip(g_logs, w_logs, strict=True):
        missing = set(w) - set(g)
        assert not missing, f"metrics missing from the padding-free log: {sorted(missing)}"
        for k, v in w.items():
            if k in TIMED or not isinstance(v, int | float):
                continue
            # relative, with an absolute floor for values that are 0 up to rounding (RLOO's first loss: its
            # advantages sum to 0, so the loss is ~1e-8 of noise in every layout)
            d = abs(g[k] - v) / (abs(v) + METRIC_FLOOR / METRIC_RTOL)
            out["metrics"] = max(out["metrics"], d)
            if d > METRIC_RTOL:
                out.setdefault("worst_metric", (k, g[k], v))
    assert len(got.recorder.steps) == len(want.recorder.steps) == got.args.max_steps
    for g, w in zip(got.recorder.steps, want.recorder.steps, strict=True):
        assert set(g) == set(w)
        out["grads"] = max(out["grads"], max(rel(g[k], w[k]) for k in w))
    return out


def assert_exact(got: Any, want: Any) -> None:
    """:func:`compare`'s differences within :data:`RTOL` (log-probs, entropies, gradients) and :data:`METRIC_RTOL`."""
    diffs = compare(got, want)
    assert diffs["logps"] <= RTOL and diffs["entropy"] <= RTOL and diffs["grads"] <= RTOL, diffs
    assert diffs["metrics"] <= METRIC_RTOL, diffs
