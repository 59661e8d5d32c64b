"""Evaluating a model on a split: the trainer's evaluation, usable on its own by inference tools."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm import tqdm

from dlrm.metrics import binary_metrics
from dlrm.progress import Ticker


@torch.no_grad()
def evaluate(model: torch.nn.Module, source, device: torch.device, precision: str = "fp32",
             progress: bool = False, say: Callable[[str], None] | None = None) -> dict:  # fmt: skip
    """AUC, log-loss, accuracy, NE, CTR and sample count of `model` over every batch of `source`
    (epoch 0), gathered across ranks when a process group is up. `progress`: tqdm's bar;
    `say`: how a long evaluation says how far it is (every 10 s, nothing when shorter)."""
    model.embeddings.sync()  # every tier current before reading rows
    was_training = model.training
    model.eval()
    logits, labels = [], []
    bf16 = precision == "bf16"
    ticker = Ticker("evaluating", len(source), None if progress else say)
    try:
        for i, batch in enumerate(tqdm(
            source.batches(0), total=len(source), disable=not progress, desc="eval", leave=False
        )):  # fmt: skip
            batch = batch.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits.append(model(batch.dense_features, batch.sparse_features).float())
            labels.append(batch.labels)
            ticker.tick(i + 1)
    finally:
        model.train(was_training)
    return binary_metrics(torch.cat(logits), torch.cat(labels))
