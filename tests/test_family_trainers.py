"""Padding-free (and prompt-once) SFT, DPO and GRPO train today's families (tests/tiny_models.py ``FAMILIES``: a
Qwen3.5-like hybrid, GPT-OSS, Llama-4) as padding does: losses, metrics, gradients, weights (issue 30, item 6).
The hybrid refuses prompt_once; left padding is not exact for Llama-4 and the hybrid, so their GRPO prompts have
one length."""

from __future__ import annotations

import layout_runs
import pytest
import tiny_dpo
import tiny_rl
import tiny_sft
from layout_runs import LAYOUTS, train_layouts
from tiny_models import FAMILIES, family, family_model

HYBRID = "qwen3_5_text"  # recurrent layers: prompt_once refused
PADDED_ATTN = {"qwen3_5_text": "sdpa", "gpt_oss": "eager", "llama4_text": "sdpa"}  # GPT-OSS has no sdpa path
PROMPT_ONCE_REFUSED = ("prompt_once=True cannot share a prompt with Qwen3_5GatedDeltaNet layers (recurrent: each "
                       "completion needs the state the prompt leaves, which only attention can share through the key "
                       "index); set prompt_once=False.")
LOSS_RTOL, GRAD_RTOL, WEIGHT_RTOL = 1e-5, 1e-4, 1e-4


def attn(model_type: str, layout: str) -> str:
    return PADDED_ATTN[model_type] if layout == "padded" else "padfree"


def no_aux_loss(model_type: str, prompt_once: bool = False) -> dict[str, float]:
    """TRL's MoE load-balancing loss off: TRL 1.16 crashes on Llama-4's (it reads ``num_experts``, which
    Llama4TextConfig lacks), and prompt_once with it is refused (forwarded once, a prompt counts once)."""
    return {"router_aux_loss_coef": 0.0} if model_type == "llama4_text" or prompt_once else {}


def trl_head_backbone(trainer) -> None:
    """TRL 1.16's fused head reads ``model.base_model``, which Llama-4's prefix ("language_model") misses: point
    it at the decoder on TRL's padded runs (the package's scored head finds the decoder itself)."""
    for model in (trainer.model, getattr(trainer, "ref_model", None)):
        if model is not None and type(model).__name__ == "Llama4ForCausalLM":
            model.base_model_prefix = "model"


def test_llama4_chunks_with_shared_prompt_keys():
    """prompt_once's rows on Llama-4 across chunk boundaries: each sequence's logits as alone (probe layouts)."""
    from trl_padfree.probe import check_layout_packing

    model = family_model(family("llama4_text"), "padfree")
    pairs = check_layout_packing(model, "preference", prompt_once=True, shapes=((11, 3, 9), (3, 14, 6), (8, 8, 1)))
    groups = check_layout_packing(model, "group", prompt_once=True, shapes=((11, (3, 9, 1)), (3, (14, 6)), (8, (8,))))
    for report in (pairs, groups):
        assert report.status == "safe" and report.max_abs_diff <= 1e-5, report


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_sft(tmp_path, model_type):
    """Padding-free vs padded collator: the same per-step losses and final weights (AdamW, 2 steps x 2 micro)."""
    family(model_type)
    tok = tiny_sft.tokenizer()
    data = tiny_sft.tokenized_dataset(tok, 16)
    runs = {}
    for padding_free in (False, True):
        model = family_model(model_type, attn(model_type, "padfree" if padding_free else "padded"))
        trainer = tiny_sft.make_trainer(padding_free, data, tok, str(tmp_path / str(padding_free)), model=model,
                                        gradient_accumulation_steps=2, max_steps=2, **no_aux_loss(model_type))
        initial = tiny_sft.weights(trainer)
        trainer.train()
        runs[padding_free] = trainer
    padded, flat = runs[False], runs[True]
    assert flat.batch_ids == padded.batch_ids and flat.num_items == padded.num_items
    loss_flat, loss_padded = tiny_sft.losses(flat), tiny_sft.losses(padded)
    assert len(loss_flat) == 2
    rel = max(abs(a - b) / abs(b) for a, b in zip(loss_flat, loss_padded, strict=True))
    assert rel <= LOSS_RTOL, (loss_flat, loss_padded)
    assert tiny_sft.max_rel_diff(tiny_sft.weights(flat), tiny_sft.weights(padded)) <= WEIGHT_RTOL
    assert tiny_sft.max_rel_diff(tiny_sft.weights(padded), initial) > 1e-4  # training moved the weights


class DPOSetup:
    """tiny_dpo's trainer with the family's model and TRL's head made usable on Llama-4 (:func:`trl_head_backbone`)."""

    def __init__(self, model_type: str) -> None:
        self.model_type = model_type

    def trainer(self, layout, data, tok, out, **kwargs):
        def make(layout: str, seed: int = 0):
            return family_model(self.model_type, attn(self.model_type, layout), seed)

        trainer = tiny_dpo.trainer(layout, data, tok, out, make_model=make, **kwargs)
        if layout == "padded":
            trl_head_backbone(trainer)
        return trainer


def same_dpo_step(layout: str, got: dict[str, float], want: dict[str, float]) -> None:
    """``tiny_dpo.same_step``; the mean logits (~1e-5, means of ~1e-1 logits of either sign) within 1e-7."""
    keys = ("logits/chosen", "logits/rejected")
    for key in keys:
        assert abs(got[key] - want[key]) <= LOSS_RTOL * max(abs(want[key]), 1e-2), (layout, key, got[key], want[key])
    tiny_dpo.same_step(layout, {**got, **{k: want[k] for k in keys}}, want)


# the hybrid's gate gradients (~1e-7 of the largest; fp32 cumulative decays chunked differently padded vs packed)
# are judged against 1e-3 of the step's largest gradient
GRAD_FLOOR = {HYBRID: 1e-3}


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_dpo(tmp_path, model_type):
    """Padded vs padding-free and prompt-once (hybrid: refused): every metric, gradient, final weight (3 SGD steps)."""
    family(model_type)
    tok, data = tiny_dpo.tokenizer(), tiny_dpo.pairs(8)
    layouts = LAYOUTS
    if model_type == HYBRID:
        layouts = ("padded", "padfree")
        with pytest.raises(ValueError) as refused:
            DPOSetup(model_type).trainer("once", data, tok, str(tmp_path / "refused"))
        assert str(refused.value) == PROMPT_ONCE_REFUSED
    runs = train_layouts(DPOSetup(model_type), data, tok, tmp_path, layouts=layouts,
                         **no_aux_loss(model_type, prompt_once="once" in layouts))
    layout_runs.assert_same_training(runs, same_dpo_step, grad_rtol=lambda layout: GRAD_RTOL,
                                     grad_floor=GRAD_FLOOR.get(model_type, 0.0))


def test_prompt_once_with_the_moe_aux_loss_is_refused(tmp_path):
    """prompt_once with the MoE load-balancing loss (prompt tokens counted once, not once per response: gradients
    ~2e-3 off on GPT-OSS) is refused in one line before any work."""
    family("gpt_oss")
    tok, data = tiny_dpo.tokenizer(), tiny_dpo.pairs(8)
    with pytest.raises(ValueError, match=r"^prompt_once=True with the MoE router load-balancing loss "
                                         r"\(router_aux_loss_coef > 0\) is not exact: .* Set router_aux_loss_coef=0\.0"):
        DPOSetup("gpt_oss").trainer("once", data, tok, str(tmp_path), router_aux_loss_coef=0.9)


def grpo_prompts(model_type: str):
    """tiny_rl's prompts; for Llama-4 and the hybrid of one length (no left padding, which is not exact for them)."""
    if model_type == "gpt_oss":
        return tiny_rl.prompts(8)
    tok = tiny_rl.tokenizer()
    rows = [r for r in tiny_rl.prompts(200, seed=1) if len(tok(r["prompt"])["input_ids"]) == 12][:8]
    assert len(rows) == 8
    from datasets import Dataset

    return Dataset.from_list(rows)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_grpo(tmp_path, model_type):
    """TRL's padded GRPO vs padding-free and prompt-once (hybrid: refused): log-probs, entropies, metrics, grads."""
    family(model_type)
    path = tiny_rl.model_path(build=lambda: family_model(model_type, "eager"), key=model_type)
    data = grpo_prompts(model_type)
    layouts = LAYOUTS
    extra = no_aux_loss(model_type, prompt_once=True)
    if model_type == HYBRID:
        layouts = ("padded", "padfree")
        with pytest.raises(ValueError) as refused:
            tiny_rl.trainer("grpo", "once", str(tmp_path / "refused"), model=path, data=data)
        assert str(refused.value) == PROMPT_ONCE_REFUSED.replace(
            "prompt_once=True", "prompt_once=True (siblings must not see each other)")
    runs = {}
    for layout in layouts:
        t = tiny_rl.trainer("grpo", layout, str(tmp_path / layout), model=path, data=data, max_steps=2,
                            model_init_kwargs={"attn_implementation": attn(model_type, layout)}, **extra)
        if layout == "padded":  # TRL's own trainer
            trl_head_backbone(t)
        initial = layout_runs.weights(t)
        t.train()
        runs[layout] = t
    moved = layout_runs.max_rel_diff(layout_runs.weights(runs["padded"]), initial)
    assert moved > 1e-4, moved
    for layout in layouts[1:]:
        diffs = tiny_rl.compare(runs[layout], runs["padded"])
        assert diffs["logps"] <= tiny_rl.RTOL and diffs["entropy"] <= tiny_rl.RTOL, (layout, diffs)
        assert diffs["grads"] <= GRAD_RTOL and diffs["metrics"] <= tiny_rl.METRIC_RTOL, (layout, diffs)


