"""Counters of embedding bytes moved between tiers, per directed link and purpose, and of syncs.

A link is a (source tier, destination tier) pair; every collection counts the host/device link
(PCIe) in both directions, and a collection with more tiers declares its other links (an SSD tier
adds ssd->host and host->ssd), so a new tier adds counters without new fields. Purposes:
- `lookup`: pooled embeddings host->device in forward and their gradients device->host in
  backward (cold mini-batches and host-only placement), or rows fetched for a lookup;
- `sync`: rows (weights + optimizer state) copied between tiers to keep replicas current (FAE's
  phase switches, before an evaluation or a checkpoint);
- `gather`: cold rows (weights + optimizer state) staged from a slower tier for a training step
  (Hotline), including rows read again because a step wrote them back after they were staged;
- `writeback`: those rows, updated by the step, sent back to the tier that owns them (Hotline).

Hotline also counts its popular inputs, the unique cold rows per mini-batch, and the time spent
gathering them (`gather_s`) against the time a step actually waited for a gather
(`exposed_gather_s`), so `hidden_share = 1 - exposed / gather` is the share hidden behind compute.

The host/device link is counted even when both tiers are in host memory (`--device cpu`), so a
CPU run reports the traffic a GPU run would have. In `as_dict()` a link's counters are named
`emb_bytes_<s>2<d>_<purpose>` (`emb_bytes_h2d_lookup`, ...) and `emb_bytes_<s>2<d>` (both
purposes): the names the trainer, the benchmarks and the summaries have always used.
"""

from __future__ import annotations

import torch

PURPOSES = ("lookup", "sync", "gather", "writeback")
TIER_LETTERS = {"device": "d", "host": "h", "ssd": "s"}
PCIE = (("host", "device"), ("device", "host"))

# Checkpoint layout: first the 11 values checkpoints have always held (so old ones load), then
# every further (link, purpose) byte count, then Hotline's fields.
_PCIE_BYTES = tuple((src, dst, p) for p in ("lookup", "sync") for src, dst in PCIE)
EVENT_FIELDS = (
    "syncs", "sync_rows", "hot_batches", "cold_batches", "train_inputs", "hot_inputs",
)  # fmt: skip
LEGACY_VALUES = len(_PCIE_BYTES) + len(EVENT_FIELDS) + 1  # + sync_s in nanoseconds
HOTLINE_FIELDS = ("popular_inputs", "hotline_batches", "cold_rows")
HOTLINE_SECONDS = ("gather_s", "exposed_gather_s")  # kept in nanoseconds


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
        self.popular_inputs = self.hotline_batches = self.cold_rows = 0
        self.gather_s = self.exposed_gather_s = 0.0

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
        d.update({f: getattr(self, f) for f in HOTLINE_FIELDS + HOTLINE_SECONDS})
        hb = self.hotline_batches
        d["popular_input_share"] = self.popular_inputs / n if hb and n else None
        d["cold_rows_per_batch"] = self.cold_rows / hb if hb else None
        g = self.gather_s
        d["hidden_share"] = max(0.0, 1.0 - self.exposed_gather_s / g) if hb and g > 0 else None
        return d

    # --- checkpoints ----------------------------------------------------------------------------
    # One int64 tensor: the 11 values checkpoints have always held, the host/device link's further
    # purposes, Hotline's fields, then every further link's bytes. Each part is appended after
    # the ones before it existed, so older tensors (11 values; no further links) still load.

    def _pcie_rest(self) -> list[tuple[str, str, str]]:
        return [(s, d, p) for p in PURPOSES for s, d in PCIE if (s, d, p) not in _PCIE_BYTES]

    def _link_keys(self) -> list[tuple[str, str, str]]:
        return [(s, d, p) for s, d in self.links if (s, d) not in PCIE for p in PURPOSES]

    def state_tensor(self) -> torch.Tensor:
        """The counters as one int64 tensor (checkpoints hold tensors and plain values only)."""
        values = [self.bytes[k] for k in _PCIE_BYTES]
        values += [getattr(self, f) for f in EVENT_FIELDS] + [round(self.sync_s * 1e9)]
        values += [self.bytes[k] for k in self._pcie_rest()]
        values += [getattr(self, f) for f in HOTLINE_FIELDS]
        values += [round(getattr(self, f) * 1e9) for f in HOTLINE_SECONDS]
        values += [self.bytes[k] for k in self._link_keys()]
        return torch.tensor(values, dtype=torch.int64)

    def load_state_tensor(self, t: torch.Tensor) -> None:
        """Restore `state_tensor()`, or an older one (see the layout above)."""
        values = [int(v) for v in t.tolist()]
        base = LEGACY_VALUES + len(self._pcie_rest()) + len(HOTLINE_FIELDS) + len(HOTLINE_SECONDS)
        full = base + len(self._link_keys())
        if len(values) not in (LEGACY_VALUES, base, full):
            raise ValueError(f"transfer counters: {len(values)} values, expected {full}")
        self.reset()
        values += [0] * (full - len(values))
        it = iter(values)
        for key in _PCIE_BYTES:
            self.bytes[key] = next(it)
        for f in EVENT_FIELDS:
            setattr(self, f, next(it))
        self.sync_s = next(it) / 1e9
        for key in self._pcie_rest():
            self.bytes[key] = next(it)
        for f in HOTLINE_FIELDS:
            setattr(self, f, next(it))
        for f in HOTLINE_SECONDS:
            setattr(self, f, next(it) / 1e9)
        for key in self._link_keys():
            self.bytes[key] = next(it)


def no_transfer_counters() -> dict:
    """`as_dict()` of a collection that moves no embedding bytes (every row on the device):
    all zero, every input "hot", no bytes per sample."""
    d = TransferStats().as_dict()
    d.update(hot_input_share=1.0, emb_bytes_per_sample=0.0)
    return d


# the counters a metrics.jsonl train event carries (the summary carries every counter)
LOGGED_COUNTERS = (
    "emb_bytes_h2d", "emb_bytes_d2h", "emb_bytes_h2d_lookup", "emb_bytes_d2h_lookup",
    "emb_bytes_h2d_sync", "emb_bytes_d2h_sync", "syncs", "hot_input_share", "sync_s",
    "emb_bytes_h2d_gather", "emb_bytes_d2h_writeback", "popular_input_share",
    "cold_rows_per_batch", "gather_s", "exposed_gather_s", "hidden_share",
)  # fmt: skip
