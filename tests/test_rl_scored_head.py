"""The scored-positions LM head in padding-free GRPO, RLOO and KTO equals TRL's fused head (fp32, relative 1e-5): the
same trainer with ``scored_lm_head`` True and False, every log-prob, entropy, metric and gradient; GRPO at temperatures
other than 1, with the entropy mask and bonus (the entropy's gradient in the loss)."""

from __future__ import annotations

import pytest
import tiny_kto as K
import tiny_rl as R
from accelerate.utils import is_peft_model
from layout_runs import assert_same_training, step_logs, train_layouts

from trl_padfree.scored_head import scored_head_state


def _base(model):
    return model.get_base_model() if is_peft_model(model) else model


def _rl_pair(tmp_path, kind: str, layout: str, **overrides):
    runs = {}
    for scored in (True, False):
        t = R.trainer(kind, layout, str(tmp_path / f"{layout}-{scored}"), scored_lm_head=scored, **overrides)
        t.train()
        runs[scored] = t
    scored, trl_head = runs[True], runs[False]
    assert scored.lm_head_state == scored.ref_lm_head_state == "scored"
    assert scored_head_state(_base(scored.model)) == "scored"
    assert scored_head_state(scored.accelerator.unwrap_model(scored.ref_model)) == "scored"
    assert trl_head.lm_head_state == trl_head.ref_lm_head_state == "trl: scored_lm_head=False"
    assert scored_head_state(_base(trl_head.model)) is None
    return scored, trl_head


RL_CASES = {
    "grpo-dapo-entropy-mask-and-bonus-t0.7": ("grpo", "padfree", dict(loss_type="dapo", temperature=0.7,
                                                                      top_entropy_quantile=0.5, entropy_coef=0.05)),
    "grpo-prompt-once-t1.3": ("grpo", "once", dict(loss_type="grpo", temperature=1.3)),
    "rloo-t0.8": ("rloo", "padfree", dict(temperature=0.8)),
}


@pytest.mark.parametrize("case", list(RL_CASES))
def test_rl_scored_head_equals_trls_head(tmp_path, case):
    kind, layout, overrides = RL_CASES[case]
    scored, trl_head = _rl_pair(tmp_path, kind, layout, **overrides)
    if kind == "grpo":
        assert any(ent is not None for _, ent in scored.recorded)  # entropies were handed to TRL's loss
    assert any(e.get("kl", 0) > 0 for e in step_logs(trl_head))  # the reference forward mattered
    R.assert_exact(scored, trl_head)


def test_the_switch_is_checked_and_padded_stays_trls(tmp_path):
    with pytest.raises(ValueError, match="scored_lm_head must be True or False, got 'yes'"):
        R.trainer("grpo", "padfree", str(tmp_path / "a"), scored_lm_head="yes")
    with pytest.raises(ValueError, match="scored_lm_head must be True or False, got 1"):
        K.trainer("padfree", K.examples(4), K.tokenizer(), str(tmp_path / "c"), scored_lm_head=1)
    t = R.trainer("rloo", "trl_padfree(padding_free=False)", str(tmp_path / "b"))
    assert t.lm_head_state == "trl: padding_free=False" and scored_head_state(t.model) is None


@pytest.mark.parametrize("layout", ["padfree", "once"])
def test_kto_scored_head_equals_trls_head(tmp_path, layout):
    data, tok = K.examples(24), K.tokenizer()
    runs = {name: train_layouts(K, data, tok, tmp_path / name, layouts=(layout,), scored_lm_head=name == "padfree")[layout]
            for name in ("padded", "padfree")}  # (named as assert_same_training takes them: TRL's head, the scored one)
    scored, trl_head = runs["padfree"][0], runs["padded"][0]
    assert scored.lm_head_state == scored.ref_lm_head_state == "scored"
    assert scored_head_state(scored.model) == "scored" and scored_head_state(trl_head.model) is None
    assert trl_head.lm_head_state == "trl: scored_lm_head=False"
    assert any(e["kl"] > 0 for e in step_logs(trl_head))  # the KL forwards (policy and reference) are in the comparison
    assert_same_training(runs, K.same_step)
