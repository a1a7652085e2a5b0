"""Training one tiny model in the three layouts (``"padded"``: TRL's batch, ``"padfree"``, ``"once"``: each prompt
once) and comparing the runs on every metric, every gradient before each optimizer step (SGD) and the final weights:
what the DPO, KTO and reward tests share; also a deliberately leaking attention."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, TrainerCallback
from transformers.masking_utils import AttentionMaskInterface
from two_ranks import run_on_two_ranks

from trl_padfree.testing import demo_corpus, tiny_llama

LAYOUTS = ("padded", "padfree", "once")
RTOL = 1e-5  # gradients and weights: max |diff| / max |padded|, per tensor
STEPS = 3  # optimizer steps of every compared run


def random_text(seed: int) -> tuple[random.Random, Callable[[int], str]]:
    """A seeded generator and ``text(k)``: ``k`` phrases of the tiny tokenizer's corpus drawn with it."""
    rng = random.Random(seed)
    corpus = demo_corpus(200, seed)
    return rng, lambda k: " ".join(rng.choice(corpus) for _ in range(k))


def lora() -> Any:
    """The LoRA adapters of the PEFT runs (a new config each time: a trainer takes its config over)."""
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)


def model(layout: str, seed: int = 0, **overrides: Any) -> Any:
    """The tiny Llama of ``layout``: ``sdpa`` for the padded batch, ``padfree`` for the rows (unless overridden)."""
    attn = "sdpa" if layout == "padded" else "padfree"
    return tiny_llama(seed=seed, attn_implementation=overrides.pop("attn_implementation", attn), **overrides)


def training_args(layout: str, out: str, **overrides: Any) -> dict[str, Any]:
    """Shared settings: 3 steps of 2 x 4, fp32 CPU, no dropout, no saves; padding-free but ``padded``."""
    return dict(output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=STEPS,
                logging_steps=1, report_to="none", save_strategy="no", bf16=False, use_cpu=True, seed=0,
                disable_dropout=True, dataloader_num_workers=0, max_length=None, padding_free=layout != "padded",
                gradient_checkpointing=False) | overrides


def step_logs(trainer: Any) -> list[dict[str, float]]:
    return [e for e in trainer.state.log_history if "loss" in e]


def weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


def assert_same_metrics(layout: str, got: dict[str, float], want: dict[str, float], keys: Any,
                        scaled: tuple[str, ...] = (), scale: float = 0.0, rtol: float = RTOL) -> None:
    """``got[key]`` within ``rtol`` of ``want[key]`` for every key: relative to the value, or to ``scale`` where that is
    more for the keys starting with one of ``scaled`` (differences of larger values, judged against those)."""
    for key in keys:
        tol = rtol * max(abs(want[key]), scale if key.startswith(scaled) else 0.0, 1e-7)
        assert abs(got[key] - want[key]) <= tol, (layout, key, got[key], want[key])


def same_preference_step(layout: str, got: dict[str, float], want: dict[str, float], keys: Any,
                         prefix: str = "") -> None:
    """DPO/KTO metrics (``prefix``: ``"eval_"`` for evaluation's): rewards and the KL term are beta (0.1) times
    (logps - ref logps), a difference of two sums of ~-200, judged against the log-probs they come from."""
    scale = 0.1 * max(abs(want[prefix + "logps/chosen"]), abs(want[prefix + "logps/rejected"]))
    assert_same_metrics(layout, got, want, keys, (prefix + "rewards/", prefix + "kl"), scale)


def loss_and_grads(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward pass of ``model`` on ``batch``: the loss and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], floor: float = 0.0) -> float:
    """The largest ``max |a - b| / max(max |b|, floor)`` over the tensors of two non-empty dicts with the same keys."""
    assert a.keys() == b.keys() and a
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(max(floor, 1e-12))).item() for k in b)


class GradRecorder(TrainerCallback):
    """Every parameter's gradient just before each optimizer step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


class Run(NamedTuple):
    """What a run is compared on: its per-step logs, its gradients before every optimizer step, its final weights."""

    logs: list[dict[str, float]]
    grads: list[dict[str, torch.Tensor]]
    weights: dict[str, torch.Tensor]


def train_layouts(setup: Any, data: Any, tok: Any, out: Path, layouts: tuple[str, ...] = LAYOUTS,
                  **kwargs: Any) -> dict[str, tuple[Any, GradRecorder]]:
    """``setup.trainer`` of each layout trained with SGD; gradients and ``recorder.initial`` kept."""
    runs = {}
    for layout in layouts:
        trainer = setup.trainer(layout, data, tok, str(out / layout), optim="sgd", **kwargs)
        recorder = GradRecorder()
        trainer.add_callback(recorder)
        recorder.initial = weights(trainer)
        trainer.train()
        runs[layout] = (trainer, recorder)
    return runs


def finished(runs: dict[str, tuple[Any, GradRecorder]]) -> dict[str, Run]:
    """The in-process runs of ``train_layouts`` as the comparison takes them."""
    return {layout: Run(step_logs(t), rec.steps, weights(t)) for layout, (t, rec) in runs.items()}


def assert_same_training(runs: dict[str, Any], same_step: Callable[[str, dict, dict], None],
                         grad_rtol: Callable[[str], float] = lambda layout: RTOL, grad_floor: float = 0.0) -> None:
    """Every layout's run (of those in ``runs``) is the padded one's: ``same_step(layout, got, want)`` on each step's
    logs, gradients within ``grad_rtol(layout)`` (of each tensor's largest, or of ``grad_floor`` times the step's
    largest gradient where that is more), weights within ``RTOL``. ``runs``: :class:`Run` s, or the in-process runs of
    :func:`train_layouts`, whose padded run must also have moved its weights (not untouched models compared)."""
    if not isinstance(runs["padded"], Run):
        padded, recorder = runs["padded"]
        assert max_rel_diff(weights(padded), recorder.initial) > 1e-4
        runs = finished(runs)
    want = runs["padded"]
    assert len(want.logs) == len(want.grads) == STEPS and len(runs) > 1
    for layout in (layout for layout in LAYOUTS[1:] if layout in runs):
        got = runs[layout]
        assert len(got.logs) == len(got.grads) == STEPS
        for step_got, step_want in zip(got.logs, want.logs, strict=True):
            same_step(layout, step_got, step_want)
        for step, (g, w) in enumerate(zip(got.grads, want.grads, strict=True)):
            floor = grad_floor * max(t.abs().max().item() for t in w.values())
            assert max_rel_diff(g, w, floor) <= grad_rtol(layout), (layout, step, max_rel_diff(g, w, floor))
        assert max_rel_diff(got.weights, want.weights) <= RTOL


def ddp_runs(trainer: str, out: Path) -> dict[str, Run]:
    """tests/ddp_layouts.py on 2 CPU ranks: every layout ran over 24 of 32 records; rank 0's runs."""
    run_on_two_ranks("ddp_layouts.py", out, trainer)
    assert (out / "rank0.done").exists() and (out / "rank1.done").exists()  # both ranks ran to the end
    results = json.loads((out / "results.json").read_text())
    runs = {}
    for layout in LAYOUTS:
        assert results[layout]["world_size"] == 2 and results[layout]["ranks"] == 2
        assert results[layout]["epoch"] == pytest.approx(24 / 32)
        saved = torch.load(out / f"{layout}.pt")
        runs[layout] = Run(results[layout]["logs"], saved["grads"], saved["weights"])
    return runs


def leaky_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Causal attention over the whole row: ignores every sequence boundary (what a broken kernel would do)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_leaky_attention() -> str:
    """Registers :func:`leaky_attention` (without a mask of its own) with transformers; returns its name."""
    AttentionInterface.register("leaky_test", leaky_attention)
    AttentionMaskInterface.register("leaky_test", lambda *a, **k: None)
    return "leaky_test"
