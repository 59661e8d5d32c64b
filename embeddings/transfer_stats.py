"""Counters of embedding bytes that cross the host/device link (PCIe), and of tier syncs.

They count what would cross PCIe even when both tiers are in host memory (`--device cpu`), so a
CPU run reports the traffic a GPU run would have:
- `_lookup`: pooled embeddings host->device in forward, their gradients device->host in backward
  (cold mini-batches and host-only placement);
- `_sync`: rows (weights + optimizer state) copied between the tiers when FAE switches phase or
  before an evaluation or checkpoint.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

INT_FIELDS = (
    "emb_bytes_h2d_lookup", "emb_bytes_d2h_lookup", "emb_bytes_h2d_sync", "emb_bytes_d2h_sync",
    "syncs", "sync_rows", "hot_batches", "cold_batches", "train_inputs", "hot_inputs",
)  # fmt: skip


@dataclass
class TransferStats:
    emb_bytes_h2d_lookup: int = 0
    emb_bytes_d2h_lookup: int = 0
    emb_bytes_h2d_sync: int = 0
    emb_bytes_d2h_sync: int = 0
    syncs: int = 0
    sync_rows: int = 0
    hot_batches: int = 0
    cold_batches: int = 0
    train_inputs: int = 0
    hot_inputs: int = 0
    sync_s: float = 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["emb_bytes_h2d"] = self.emb_bytes_h2d_lookup + self.emb_bytes_h2d_sync
        d["emb_bytes_d2h"] = self.emb_bytes_d2h_lookup + self.emb_bytes_d2h_sync
        n = self.train_inputs
        d["hot_input_share"] = self.hot_inputs / n if n else None
        d["emb_bytes_per_sample"] = (d["emb_bytes_h2d"] + d["emb_bytes_d2h"]) / n if n else None
        return d

    def state_tensor(self) -> torch.Tensor:
        """The counters as one int64 tensor (checkpoints hold tensors and plain values only)."""
        return torch.tensor(
            [getattr(self, f) for f in INT_FIELDS] + [round(self.sync_s * 1e9)], dtype=torch.int64
        )

    def load_state_tensor(self, t: torch.Tensor) -> None:
        values = t.tolist()
        if len(values) != len(INT_FIELDS) + 1:
            raise ValueError(
                f"transfer counters: {len(values)} values, expected {len(INT_FIELDS) + 1}"
            )
        for f, v in zip(INT_FIELDS, values):
            setattr(self, f, int(v))
        self.sync_s = values[-1] / 1e9

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default)
