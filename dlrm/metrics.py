"""Evaluation metrics for click prediction: AUC, log-loss, accuracy and normalized entropy."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_EPS = 1e-7


def gather_across_ranks(t: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of `t`, concatenated in rank order (identity without a process group).

    Ranks may hold different numbers of rows (the last, short batch of a split does not divide
    evenly), so the sizes are exchanged first and each rank's rows padded to the largest."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    world = dist.get_world_size()
    mine = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(sizes, mine)
    counts = [int(s) for s in sizes]
    padded = t.new_zeros((max(counts), *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, counts)])


def binary_auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The area under the ROC curve of `scores` against 0/1 `labels` (both classes present),
    exactly, as torchmetrics' `binary_auroc` computes it: the Mann-Whitney statistic, tied scores
    at their average rank (half a pair's credit). Written out because importing torchmetrics
    took a second of every command's start, an eighth of `python -m dlrm.train`'s imports."""
    order = torch.argsort(scores)
    _, counts = torch.unique_consecutive(scores[order], return_counts=True)
    group = torch.repeat_interleave(torch.arange(len(counts)), counts)
    positives = torch.zeros(len(counts), dtype=torch.float64)
    positives.index_add_(0, group, labels[order].to(torch.float64))
    ends = counts.cumsum(0).to(torch.float64)  # a tie group's last rank (1-based)
    rank_sum = (positives * (ends - (counts.to(torch.float64) - 1) / 2)).sum().item()
    n_pos = positives.sum().item()
    n_neg = scores.numel() - n_pos
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Metrics of predicted logits against 0/1 labels.

    NE (normalized entropy, He et al. 2014) is the log-loss divided by the entropy of the
    empirical click rate: below 1 means better than always predicting the base rate.
    """
    logits = gather_across_ranks(logits.float()).cpu()
    labels = gather_across_ranks(labels.float()).cpu()
    if logits.numel() == 0:
        raise ValueError("evaluation set is empty")
    probs = torch.sigmoid(logits)
    logloss = F.binary_cross_entropy_with_logits(logits, labels).item()
    rate = labels.mean().item()
    base = rate if _EPS < rate < 1 - _EPS else min(max(rate, _EPS), 1 - _EPS)
    entropy = -(base * math.log(base) + (1 - base) * math.log(1 - base))
    auc = binary_auroc(probs, labels) if 0 < rate < 1 else float("nan")
    return {
        "auc": auc,
        "logloss": logloss,
        "accuracy": ((probs > 0.5).float() == labels).float().mean().item(),
        "ne": logloss / entropy,
        "ctr": rate,
        "samples": int(labels.numel()),
    }
