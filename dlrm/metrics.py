"""Evaluation metrics for click prediction: AUC, log-loss, accuracy and normalized entropy."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_auroc

_EPS = 1e-7


def gather_across_ranks(t: torch.Tensor) -> torch.Tensor:
    """All ranks' predictions, concatenated (identity without torch.distributed)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return t
    parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, t)  # shards are equal-sized by construction
    return torch.cat(parts)


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
    auc = binary_auroc(probs, labels.long()).item() if 0 < rate < 1 else float("nan")
    return {
        "auc": auc,
        "logloss": logloss,
        "accuracy": ((probs > 0.5).float() == labels).float().mean().item(),
        "ne": logloss / entropy,
        "ctr": rate,
        "samples": int(labels.numel()),
    }
