"""trl_padfree.RLOOTrainer: padding-free and prompt-once RLOO equal TRL's padded RLOOTrainer.

As tests/test_grpo.py: real trainers, tiny fp32 Llama, TRL's seeded generation, 3 SGD steps, gradient accumulation
2, ``num_iterations=2`` (old log-probs); RLOO's default ``beta=0.05`` (a reference model, or the adapters off under
PEFT). Compared with TRL's padded trainer: the log-probs and entropies TRL's loss receives, every logged metric,
every parameter's gradient before each optimizer step.
"""

from __future__ import annotations

import pytest
import trl

from trl_padfree._compat import rl_padding_free_unavailable

if rl_padding_free_unavailable():
    pytest.skip(rl_padding_free_unavailable(), allow_module_level=True)

from layout_runs import LAYOUTS, step_logs
from tiny_rl import METRIC_RTOL, RTOL, compare, trainer

import trl_padfree


def _assert_exact(diffs: dict) -> None:
    assert diffs["logps"] <= RTOL and diffs["entropy"] <= RTOL and diffs["grads"] <= RTOL, diffs
    assert diffs["metrics"] <= METRIC_RTOL, diffs


@pytest.mark.parametrize("peft", [False, True], ids=["full", "peft"])
def test_rloo_matches_trl(tmp_path, peft):
    lora = None
    runs = {}
    for layout in LAYOUTS:
        if peft:
            from peft import LoraConfig

            lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
        t = trainer("rloo", layout, str(tmp_path / layout), peft=lora, learning_rate=0.5 if peft else 0.05)
        assert isinstance(t, trl.RLOOTrainer) and (layout == "padded") != isinstance(t, trl_padfree.RLOOTrainer)
        assert (t.ref_model is None) == peft
        t.train()
        runs[layout] = t
    assert any(e.get("kl", 0) > 0 for e in step_logs(runs["padded"]))  # the reference forward mattered
    assert runs["once"].pack_totals["no_grad"]["shared_tokens"] > 0
    assert runs["once"].pack_totals["train"]["shared_tokens"] > 0
    for layout in ("padfree", "once"):
        _assert_exact(compare(runs[layout], runs["padded"]))
