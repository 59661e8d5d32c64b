"""Counters of embedding bytes moved between tiers, per directed link and purpose, and of syncs.

A link is a (source tier, destination tier) pair; every collection counts the host/device link
(PCIe) in both directions, and a collection with more tiers declares its other links (an SSD tier
adds ssd->host and host->ssd), so a new tier adds counters without new fields. Purposes:
- `lookup`: pooled embeddings host->device in forward and their gradients device->host in
  backward (cold mini-batches and host-only placement), or rows fetched for a lookup;
- `sync`: rows (weights + optimizer state) copied between tiers to keep replicas current (FAE's
  phase switches, before an evaluation or a checkpoint).

The host/device link is counted even when both tiers are in host memory (`--device cpu`), so a
CPU run reports the traffic a GPU run would have. In `as_dict()` a link's counters are named
`emb_bytes_<s>2<d>_<purpose>` (`emb_bytes_h2d_lookup`, ...) and `emb_bytes_<s>2<d>` (both
purposes): the names the trainer, the benchmarks and the summaries have always used.
"""

from __future__ import annotations

import torch

PURPOSES = ("lookup", "sync")
TIER_LETTERS = {"device": "d", "host": "h", "ssd": "s"}
PCIE = (("host", "device"), ("device", "host"))

# Checkpoint layout, first the 11 values checkpoints have always held (so old ones load), then
# the bytes of every further link, purposes in PURPOSES order.
_PCIE_BYTES = tuple((src, dst, p) for p in PURPOSES for src, dst in PCIE)
EVENT_FIELDS = (
    "syncs", "sync_rows", "hot_batches", "cold_batches", "train_inputs", "hot_inputs",
)  # fmt: skip
LEGACY_VALUES = len(_PCIE_BYTES) + len(EVENT_FIELDS) + 1  # + sync_s in nanoseconds


def link_name(src: str, dst: str) -> str:
    """('host', 'device') -> 'h2d'."""
    for tier in (src, dst):
        if tier not in TIER_LETTERS:
            raise ValueError(f"unknown tier {tier!r}: expected one of {', '.join(TIER_LETTERS)}")
    return f"{TIER_LETTERS[src]}2{TIER_LETTERS[dst]}"


class TransferStats:
    """Bytes per (link, purpose), syncs, and FAE's hot/cold mini-batch and input counts."""

    def __init__(self, links: tuple[tuple[str, str], ...] = ()) -> None:
        extra = tuple(link for link in links if link not in PCIE)
        for src, dst in extra:
            link_name(src, dst)  # validates
        self.links = PCIE + tuple(dict.fromkeys(extra))
        self.reset()

    def reset(self) -> None:
        self.bytes = {(s, d, p): 0 for p in PURPOSES for s, d in self.links}
        self.syncs = self.sync_rows = 0
        self.hot_batches = self.cold_batches = 0
        self.train_inputs = self.hot_inputs = 0
        self.sync_s = 0.0

    def add_bytes(self, src: str, dst: str, purpose: str, n: int) -> None:
        key = (src, dst, purpose)
        if key not in self.bytes:
            raise KeyError(f"transfer counters: no link {src}->{dst} for {purpose!r} declared")
        self.bytes[key] += int(n)

    def link_bytes(self, src: str, dst: str) -> int:
        return sum(self.bytes[(src, dst, p)] for p in PURPOSES)

    def as_dict(self) -> dict:
        d: dict = {f"emb_bytes_{link_name(s, dst)}_{p}": n for (s, dst, p), n in self.bytes.items()}
        d.update({f: getattr(self, f) for f in EVENT_FIELDS}, sync_s=self.sync_s)
        for s, dst in self.links:
            d[f"emb_bytes_{link_name(s, dst)}"] = self.link_bytes(s, dst)
        n = self.train_inputs
        pcie = sum(self.link_bytes(s, dst) for s, dst in PCIE)
        d["hot_input_share"] = self.hot_inputs / n if n else None
        d["emb_bytes_per_sample"] = pcie / n if n else None  # the host/device link's bytes
        return d

    # --- checkpoints ----------------------------------------------------------------------------

    def _layout(self) -> list[tuple[str, str, str]]:
        return list(_PCIE_BYTES) + [
            (s, d, p) for s, d in self.links if (s, d) not in PCIE for p in PURPOSES
        ]

    def state_tensor(self) -> torch.Tensor:
        """The counters as one int64 tensor (checkpoints hold tensors and plain values only)."""
        layout = self._layout()
        values = [self.bytes[k] for k in layout[: len(_PCIE_BYTES)]]
        values += [getattr(self, f) for f in EVENT_FIELDS] + [round(self.sync_s * 1e9)]
        values += [self.bytes[k] for k in layout[len(_PCIE_BYTES) :]]
        return torch.tensor(values, dtype=torch.int64)

    def load_state_tensor(self, t: torch.Tensor) -> None:
        """Restore `state_tensor()`; a tensor of the 11 host/device values (checkpoints written
        before other links existed) leaves the other links at zero."""
        values = [int(v) for v in t.tolist()]
        layout = self._layout()
        want = LEGACY_VALUES + len(layout) - len(_PCIE_BYTES)
        if len(values) not in (want, LEGACY_VALUES):
            raise ValueError(f"transfer counters: {len(values)} values, expected {want}")
        self.reset()
        n_pcie = len(_PCIE_BYTES)
        for key, v in zip(layout[:n_pcie], values[:n_pcie]):
            self.bytes[key] = v
        for f, v in zip(EVENT_FIELDS, values[n_pcie:]):
            setattr(self, f, v)
        self.sync_s = values[LEGACY_VALUES - 1] / 1e9
        for key, v in zip(layout[n_pcie:], values[LEGACY_VALUES:]):
            self.bytes[key] = v


def no_transfer_counters() -> dict:
    """`as_dict()` of a collection that moves no embedding bytes (every row on the device):
    all zero, every input "hot", no bytes per sample."""
    d = TransferStats().as_dict()
    d.update(hot_input_share=1.0, emb_bytes_per_sample=0.0)
    return d
