"""Which inputs are *all hot*: every one of their lookups (all features) is a row of the device tier.

FAE trains an all-hot mini-batch entirely on the device tier, the scheduler groups inputs by it,
and the plan's report measures its share on the profile's sample. The three must agree exactly
(a batch the scheduler calls hot but the collection runs cold would silently cost a sync and two
transfers), so they all call `all_hot_inputs` here, on torch tensors (numpy through
`torch.from_numpy`).

Lookups are table-major, as in a KeyedJaggedTensor in feature order: `lengths` [T * batch] (the
bags of table 0, then table 1, ...) and `values` the row ids of each table. A table's rows are
found in the tier through the plan's concatenated remap: global row = row_base[table] + row,
remap[global row] = its slot in the tier, -1 = not there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from embeddings.kjt_ops import in_feature_order

if TYPE_CHECKING:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from embeddings.plan import PlacementPlan


def lookup_slots(
    remap: torch.Tensor,
    row_base: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    batch: int,
) -> torch.Tensor:
    """Each lookup's slot in the tier `remap` describes (-1 = not there), on `values`' device."""
    per_table = lengths.view(row_base.numel(), batch).sum(1)
    base = row_base.to(values.device)
    gid = values.long() + base.repeat_interleave(per_table, output_size=values.numel())
    return remap[gid]


def all_hot_inputs(
    remap: torch.Tensor,
    row_base: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    batch: int,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """bool [batch]: input i is all hot when every one of its lookups has a slot (an input
    without lookups is all hot). `slots`, when the caller has them, are `lookup_slots(...)`."""
    if slots is None:
        slots = lookup_slots(remap, row_base, values, lengths, batch)
    return all_hot_given_cold(torch.nonzero(slots < 0).squeeze(1), lengths, batch)


def all_hot_given_cold(cold_at: torch.Tensor, lengths: torch.Tensor, batch: int) -> torch.Tensor:
    """bool [batch]: the inputs none of whose lookups is at a position in `cold_at` (the
    positions of the cold lookups in `values`)."""
    hot = torch.ones(batch, dtype=torch.bool, device=cold_at.device)
    if cold_at.numel():  # else every lookup hot (FAE's hot batches): no per-input work
        ends = torch.cumsum(lengths.to(cold_at.device).long(), 0)
        bag = torch.searchsorted(ends, cold_at, right=True)
        hot[bag % batch] = False  # bags are table-major: bag b belongs to input b % batch
    return hot


class AllHotClassifier:
    """`AllHotClassifier(plan)(kjt)` -> bool [batch] on the CPU: the inputs whose lookups are
    all in the plan's device tier; keys in any order. A plan without device rows has no hot
    input (there is no device tier to train one on). A plan whose device tier is in the sparse
    form is looked up by binary search in its sorted hot global ids (a hot row's slot is its
    position there), so the dense remap (4 bytes for every row) is not made unless `remap` is
    asked for."""

    def __init__(self, plan: PlacementPlan) -> None:
        self.plan = plan
        self.feature_names = list(plan.feature_names)
        self.num_hot = plan.num_hot
        base = torch.zeros(len(plan.table_sizes), dtype=torch.int64)
        base[1:] = torch.cumsum(torch.tensor(plan.table_sizes[:-1], dtype=torch.int64), 0)
        self.row_base = base
        self._remaps: dict[torch.device, torch.Tensor] = {}
        self._hot: dict[torch.device, torch.Tensor] = {}
        self.sparse = plan.tier("device").remaps is None
        if self.sparse:
            t, r = plan.hot_ids()  # slot order = global id order in the sparse form
            self._hot[torch.device("cpu")] = torch.from_numpy(r) + base[torch.from_numpy(t)]
        else:
            self._remaps[torch.device("cpu")] = torch.from_numpy(plan.concatenated_remap()[0])

    def remap(self, device: torch.device) -> torch.Tensor:
        """The concatenated remap on `device` (copied there once; made from a sparse plan)."""
        cpu = torch.device("cpu")
        if cpu not in self._remaps:
            self._remaps[cpu] = torch.from_numpy(self.plan.concatenated_remap()[0])
        if device not in self._remaps:
            self._remaps[device] = self._remaps[cpu].to(device)
        return self._remaps[device]

    def slots(self, values: torch.Tensor, lengths: torch.Tensor, batch: int) -> torch.Tensor:
        if not self.sparse:
            return lookup_slots(self.remap(values.device), self.row_base, values, lengths, batch)
        if values.device not in self._hot:
            self._hot[values.device] = self._hot[torch.device("cpu")].to(values.device)
        hot = self._hot[values.device]
        per_table = lengths.view(self.row_base.numel(), batch).sum(1)
        base = self.row_base.to(values.device)
        gid = values.long() + base.repeat_interleave(per_table, output_size=values.numel())
        if not hot.numel():
            return torch.full_like(gid, -1)
        at = torch.searchsorted(hot, gid).clamp(max=hot.numel() - 1)
        return torch.where(hot[at] == gid, at, torch.full_like(at, -1))

    def mask(
        self,
        values: torch.Tensor,
        lengths: torch.Tensor,
        batch: int,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """bool [batch] on `values`' device, for table-major lookups in feature order."""
        if not self.num_hot:
            return torch.zeros(batch, dtype=torch.bool, device=values.device)
        if slots is None:
            slots = self.slots(values, lengths, batch)
        return all_hot_given_cold(torch.nonzero(slots < 0).squeeze(1), lengths, batch)

    def __call__(self, features: KeyedJaggedTensor) -> torch.Tensor:
        features = in_feature_order(features, self.feature_names)
        values, lengths = features.values().cpu(), features.lengths().cpu().long()
        return self.mask(values, lengths, features.stride())
