"""Evaluating a model on a split: the trainer's evaluation, usable on its own by inference tools."""

from __future__ import annotations

import torch
from tqdm import tqdm

from dlrm.metrics import binary_metrics


@torch.no_grad()
def evaluate(model: torch.nn.Module, source, device: torch.device, precision: str = "fp32",
             progress: bool = False) -> dict:  # fmt: skip
    """AUC, log-loss, accuracy, NE, CTR and sample count of `model` over every batch of `source`
    (epoch 0), gathered across ranks when a process group is up."""
    model.embeddings.sync()  # every tier current before reading rows
    was_training = model.training
    model.eval()
    logits, labels = [], []
    bf16 = precision == "bf16"
    try:
        for batch in tqdm(
            source.batches(0), total=len(source), disable=not progress, desc="eval", leave=False
        ):
            batch = batch.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits.append(model(batch.dense_features, batch.sparse_features).float())
            labels.append(batch.labels)
    finally:
        model.train(was_training)
    return binary_metrics(torch.cat(logits), torch.cat(labels))
