"""DPO losses over per-sequence sums: TRL 1.16's ``DPOTrainer`` loss types, on ``(B,)`` tensors.

TRL computes its losses inside ``DPOTrainer._compute_loss`` from a padded ``(2B, T)`` batch. With a flat row the
same quantities are per-sequence sums (:func:`trl_padfree.preference.segment_sum`), so the formulas are restated
here as pure functions of them. They follow TRL 1.16 term by term, and the tests compare every loss type with
TRL's own trainer on the same pairs (``tests/test_dpo.py``), so a change in TRL shows up as a failing test.

>>> c, r = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.5])
>>> zero = torch.zeros(2)
>>> stats = PairStats(c, r, zero, zero, chosen_lens=torch.tensor([2, 2]), rejected_lens=torch.tensor([4, 1]))
>>> round(pair_loss("sigmoid", stats, beta=0.1).mean().item(), 6)
0.658299
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["F_DIVERGENCE_TYPES", "LOSS_TYPES", "PairStats", "f_divergence_scores", "pair_loss"]

LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)


@dataclass
class PairStats:
    """Per-pair quantities the losses need (each ``(B,)``)."""

    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor
    ref_chosen_logps: torch.Tensor
    ref_rejected_logps: torch.Tensor
    chosen_lens: torch.Tensor  # completion tokens (TRL: completion_mask.sum(dim=1))
    rejected_lens: torch.Tensor
    sft_loss: torch.Tensor | None = None  # mean negative log-prob of the chosen tokens (loss type "sft")
    chosen_scores: torch.Tensor | None = None
    rejected_scores: torch.Tensor | None = None

    @property
    def chosen_logratios(self) -> torch.Tensor:
        return self.chosen_logps - self.ref_chosen_logps

    @property
    def rejected_logratios(self) -> torch.Tensor:
        return self.rejected_logps - self.ref_rejected_logps


#: TRL's ``DPOConfig.f_divergence_type`` values (its field help; :func:`f_divergence_scores` handles each)
F_DIVERGENCE_TYPES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")


def f_divergence_scores(
    chosen_logratios: torch.Tensor, rejected_logratios: torch.Tensor, f_divergence_type: str, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores DPO compares, for TRL's ``f_divergence_type`` (``"reverse_kl"`` is standard DPO)."""
    if f_divergence_type not in F_DIVERGENCE_TYPES:
        raise ValueError(f"Unknown f_divergence_type: {f_divergence_type}")

    def score(logratios: torch.Tensor) -> torch.Tensor:
        if f_divergence_type == "forward_kl":
            return 1 - torch.exp(-logratios)
        if f_divergence_type == "js_divergence":
            return math.log(2) + F.logsigmoid(logratios)
        if f_divergence_type == "alpha_divergence" and abs(alpha - 1.0) >= 1e-6:
            clamp_max = 11.0 if logratios.dtype == torch.float16 else 80.0
            t = torch.clamp(((alpha - 1.0) * logratios).float(), max=clamp_max)
            return (torch.exp(t) - 1.0).to(logratios.dtype) * (1.0 / (alpha - 1.0))
        return logratios

    return score(chosen_logratios), score(rejected_logratios)


def pair_loss(
    loss_type: str, stats: PairStats, *, beta: float, label_smoothing: float = 0.0,
    discopop_tau: float = 0.05,
) -> torch.Tensor:
    """Per-pair loss ``(B,)`` of one TRL loss type (the trainer takes its mean times the type's weight)."""
    chosen_scores = stats.chosen_logratios if stats.chosen_scores is None else stats.chosen_scores
    rejected_scores = stats.rejected_logratios if stats.rejected_scores is None else stats.rejected_scores
    delta = chosen_scores - rejected_scores
    chosen_rewards, rejected_rewards = beta * stats.chosen_logratios, beta * stats.rejected_logratios
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * delta)
    if loss_type == "hinge":
        return torch.relu(1 - beta * delta)
    if loss_type in {"ipo", "sigmoid_norm"}:
        avg = chosen_scores / stats.chosen_lens.clamp(min=1.0) - rejected_scores / stats.rejected_lens.clamp(min=1.0)
        return (avg - 1 / (2 * beta)) ** 2 if loss_type == "ipo" else -F.logsigmoid(beta * avg)
    if loss_type == "exo_pair":
        epsilon = torch.tensor(label_smoothing, device=delta.device)
        qw, log_qw = torch.sigmoid(beta * delta), F.logsigmoid(beta * delta)
        ql, log_ql = torch.sigmoid(-beta * delta), F.logsigmoid(-beta * delta)
        return qw * (log_qw - torch.log1p(-epsilon)) + ql * (log_ql - torch.log(epsilon))
    if loss_type == "nca_pair":
        return (-F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards)
                - 0.5 * F.logsigmoid(-rejected_rewards))
    if loss_type == "robust":
        clean = -(1 - label_smoothing) * F.logsigmoid(beta * delta)
        flipped = -label_smoothing * F.logsigmoid(-beta * delta)
        return (clean - flipped) / (1 - 2 * label_smoothing)
    if loss_type == "bco_pair":
        return -F.logsigmoid(chosen_rewards) - F.logsigmoid(-rejected_rewards)
    if loss_type == "sppo_hard":
        return (stats.chosen_logratios - 0.5 / beta) ** 2 + (stats.rejected_logratios + 0.5 / beta) ** 2
    if loss_type in {"aot", "aot_unpaired"}:
        if loss_type == "aot":
            logratios, _ = torch.sort(stats.chosen_logps - stats.rejected_logps, dim=0)
            ref_logratios, _ = torch.sort(stats.ref_chosen_logps - stats.ref_rejected_logps, dim=0)
            d = logratios - ref_logratios
        else:
            d = torch.sort(stats.chosen_logratios, dim=0)[0] - torch.sort(stats.rejected_logratios, dim=0)[0]
        return -F.logsigmoid(beta * d) * (1 - label_smoothing) - F.logsigmoid(-beta * d) * label_smoothing
    if loss_type == "apo_zero":
        return (1 - torch.sigmoid(chosen_rewards)) + torch.sigmoid(rejected_rewards)
    if loss_type == "apo_down":
        return torch.sigmoid(chosen_rewards) + (1 - torch.sigmoid(beta * (stats.chosen_logratios
                                                                          - stats.rejected_logratios)))
    if loss_type == "discopop":
        logits = delta * beta
        modulation = torch.sigmoid(logits / discopop_tau)
        return -F.logsigmoid(logits) * (1 - modulation) + torch.exp(-logits) * modulation
    if loss_type == "sft":
        if stats.sft_loss is None:
            raise ValueError("loss type 'sft' needs PairStats.sft_loss")
        return stats.sft_loss.expand(stats.chosen_logps.shape[0])
    raise ValueError(f"Unknown loss type: {loss_type}. Should be one of {list(LOSS_TYPES)}")
