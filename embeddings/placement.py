"""Placement plans: which embedding rows are hot (kept on the device tier), from an access profile.

    plan = plan_placement(profile, dims=[16] * 26, optimizer=SparseOptimizer("rowwise_adagrad"),
                          device_budget=parse_bytes("256MB"))
    plan.save("plan.npz")            # plan.npz (remap arrays) + plan.json (what a person reads)
    plan.remaps[t][row]              # index in the one concatenated hot table, or -1 (cold)

Rules (each one a bug of the original FAE code we do not copy):
- remap arrays are integers (int32 while the hot table has < 2**31 rows, else int64), never
  floats, which lose row ids beyond 2**24;
- a row never seen in the sample is never hot, whatever the budget;
- a hot row costs its weights AND its optimizer state (`SparseOptimizer.state_floats`);
- rows compete across tables by lookups per byte, ties broken by (table, row): the same profile
  always gives the same plan.
Within one table, hot rows keep their id order in the hot table (offset of the table + rank).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embeddings.config import SparseOptimizer
from embeddings.errors import PlacementError
from embeddings.profile import AccessProfile

FORMAT = "hybrid-dlrm/placement-plan"
VERSION = 1
FLOAT_BYTES = 4

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str | int, flag: str = "--hot-budget") -> int:
    """'256MB', '1.5G', '64KiB', '1048576' -> bytes (binary units: 1 MB = 2**20 bytes)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", str(text))
        if not m:
            raise PlacementError(
                f"{flag}: expected a size like 256MB, 1.5GB or 1048576, got {text!r}"
            )
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 0:
        raise PlacementError(f"{flag}: expected a size >= 0, got {text!r}")
    return value


def row_bytes(dim: int, optimizer: SparseOptimizer) -> int:
    """Bytes one row occupies in a tier: fp32 weights plus the fused optimizer's state."""
    return (dim + optimizer.state_floats(dim)) * FLOAT_BYTES


def remap_dtype(hot_rows: int) -> np.dtype:
    return np.dtype(np.int32) if hot_rows < 2**31 - 1 else np.dtype(np.int64)


@dataclass
class PlacementPlan:
    feature_names: list[str]
    table_sizes: list[int]
    dims: list[int]
    optimizer: str
    remaps: list[np.ndarray]  # per table [rows]: index into the hot table, -1 = cold
    device_budget: int
    host_budget: int | None = None
    report: dict = field(default_factory=dict)

    # --- derived ------------------------------------------------------------------------------

    @property
    def hot_rows(self) -> list[int]:
        return [int((r >= 0).sum()) for r in self.remaps]

    @property
    def hot_offsets(self) -> list[int]:
        out, acc = [], 0
        for h in self.hot_rows:
            out.append(acc)
            acc += h
        return out

    @property
    def num_hot(self) -> int:
        return sum(self.hot_rows)

    def bytes_per_row(self) -> list[int]:
        opt = SparseOptimizer(self.optimizer)
        return [row_bytes(d, opt) for d in self.dims]

    def device_bytes(self) -> int:
        return sum(h * b for h, b in zip(self.hot_rows, self.bytes_per_row()))

    def host_bytes(self) -> int:
        """The host tier holds every row (the hot ones as the replica synchronised with the device)."""
        return sum(n * b for n, b in zip(self.table_sizes, self.bytes_per_row()))

    def hot_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(table, row) of every hot-table entry, int64, in hot-table order."""
        tables, rows = [], []
        for t, r in enumerate(self.remaps):
            ids = np.flatnonzero(r >= 0)
            ids = ids[np.argsort(r[ids], kind="stable")]
            tables.append(np.full(ids.size, t, dtype=np.int64))
            rows.append(ids.astype(np.int64))
        return np.concatenate(tables), np.concatenate(rows)

    def concatenated_remap(self) -> tuple[np.ndarray, np.ndarray]:
        """(remap of all tables back to back, first global row of each table), for one gather."""
        base = np.zeros(len(self.table_sizes), dtype=np.int64)
        base[1:] = np.cumsum(self.table_sizes)[:-1]
        return np.concatenate(self.remaps), base

    def check_fits(
        self,
        feature_names: list[str],
        table_sizes: list[int],
        dims: list[int],
        optimizer: str,
        what: str,
    ) -> None:
        """Raise one line when the plan was made for other tables or another optimizer."""
        if list(feature_names) != self.feature_names:
            raise PlacementError(
                f"{what}: made for features {self.feature_names[:3]}..., the model has {list(feature_names)[:3]}..."
            )
        if list(table_sizes) != self.table_sizes:
            bad = (
                next(i for i, (a, b) in enumerate(zip(table_sizes, self.table_sizes)) if a != b)
                if len(table_sizes) == len(self.table_sizes)
                else None
            )
            detail = (
                f"table {bad}: {self.table_sizes[bad]} rows in the plan, {table_sizes[bad]} in the model"
                if bad is not None
                else f"{len(self.table_sizes)} tables in the plan, {len(table_sizes)} in the model"
            )
            raise PlacementError(f"{what}: made for other tables ({detail})")
        if list(dims) != self.dims:
            raise PlacementError(
                f"{what}: made for embedding widths {sorted(set(self.dims))}, the model has {sorted(set(dims))}"
            )
        if optimizer != self.optimizer:
            raise PlacementError(
                f"{what}: made for optimizer {self.optimizer}, the model uses {optimizer} (its budget counts that optimizer's state)"
            )

    # --- files --------------------------------------------------------------------------------

    def meta(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "feature_names": self.feature_names,
            "table_sizes": self.table_sizes,
            "dims": self.dims,
            "optimizer": self.optimizer,
            "device_budget": self.device_budget,
            "host_budget": self.host_budget,
            "hot_rows": self.hot_rows,
            "hot_offsets": self.hot_offsets,
            "bytes_per_row": self.bytes_per_row(),
            "device_bytes": self.device_bytes(),
            "host_bytes": self.host_bytes(),
            "report": self.report,
        }

    def save(self, path: str | Path) -> Path:
        """`X.npz` (the remap arrays and the metadata) and `X.json` (the metadata, for people)."""
        path = Path(path).with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = self.meta()
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            meta=np.array(json.dumps(meta)),
            **{f"remap_{t}": r for t, r in enumerate(self.remaps)},
        )
        tmp.replace(path)
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> PlacementPlan:
        path = Path(path).with_suffix(".npz")
        if not path.is_file():
            raise PlacementError(f"{path}: no such placement plan")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                if meta.get("format") != FORMAT:
                    raise PlacementError(
                        f"{path}: not a placement plan (format {meta.get('format')!r})"
                    )
                if meta.get("version") != VERSION:
                    raise PlacementError(
                        f"{path}: plan version {meta.get('version')}, expected {VERSION}"
                    )
                remaps = [np.asarray(z[f"remap_{t}"]) for t in range(len(meta["table_sizes"]))]
        except PlacementError:
            raise
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            raise PlacementError(
                f"{path}: not a readable placement plan ({str(e).splitlines()[0][:160]})"
            ) from None
        plan = cls(
            list(meta["feature_names"]), [int(n) for n in meta["table_sizes"]], [int(d) for d in meta["dims"]],
            str(meta["optimizer"]), remaps, int(meta["device_budget"]), meta.get("host_budget"),
            dict(meta.get("report", {})),
        )  # fmt: skip
        plan.validate(str(path))
        return plan

    def validate(self, what: str = "placement plan") -> None:
        """The remap arrays must be integer, in range and a bijection onto the hot table."""
        if len(self.remaps) != len(self.table_sizes):
            raise PlacementError(
                f"{what}: {len(self.remaps)} remap arrays for {len(self.table_sizes)} tables"
            )
        for t, (r, n, off, h) in enumerate(
            zip(self.remaps, self.table_sizes, self.hot_offsets, self.hot_rows)
        ):
            if r.dtype.kind != "i":
                raise PlacementError(
                    f"{what}: remap of table {t} is {r.dtype}, expected signed integers"
                )
            if r.shape != (n,):
                raise PlacementError(
                    f"{what}: remap of table {t} has shape {list(r.shape)}, expected [{n}]"
                )
            hot = np.sort(r[r >= 0])
            if (r < -1).any() or not np.array_equal(hot, np.arange(off, off + h, dtype=hot.dtype)):
                raise PlacementError(
                    f"{what}: remap of table {t} must map its hot rows onto {off}..{off + h - 1} exactly once (-1 = cold)"
                )
        if self.device_bytes() > self.device_budget:
            raise PlacementError(
                f"{what}: hot rows need {self.device_bytes()} bytes, over the device budget of {self.device_budget}"
            )


def plan_placement(
    profile: AccessProfile,
    dims: list[int],
    optimizer: SparseOptimizer,
    device_budget: int,
    host_budget: int | None = None,
) -> PlacementPlan:
    """The hot rows that fit `device_budget` bytes (weights + optimizer state), hottest per byte first."""
    T = profile.num_tables
    if len(dims) != T:
        raise PlacementError(f"{len(dims)} embedding widths for {T} tables")
    bpr = np.array([row_bytes(d, optimizer) for d in dims], dtype=np.int64)
    host_need = int(sum(n * b for n, b in zip(profile.table_sizes, bpr)))
    if host_budget is not None and host_need > host_budget:
        raise PlacementError(
            f"the host tier needs {host_need} bytes for every row, over its budget of {host_budget}"
        )
    # candidates: rows seen at least once (never-seen rows are never hot)
    tables, rows, counts = [], [], []
    for t, c in enumerate(profile.counts):
        ids = np.flatnonzero(c > 0)
        tables.append(np.full(ids.size, t, dtype=np.int64))
        rows.append(ids.astype(np.int64))
        counts.append(c[ids])
    table = np.concatenate(tables)
    row = np.concatenate(rows)
    count = np.concatenate(counts)
    if np.unique(bpr).size == 1:
        score = count.astype(np.float64)  # integral: exact order
    else:
        score = count / bpr[table]
    order = np.lexsort((row, table, -score))  # last key first: score desc, then table, then row
    cum = np.cumsum(bpr[table[order]])
    take = order[: int(np.searchsorted(cum, device_budget, side="right"))]
    chosen_t, chosen_r = table[take], row[take]
    remaps = []
    hot_rows = np.bincount(chosen_t, minlength=T)
    dtype = remap_dtype(int(hot_rows.sum()))
    offset = 0
    for t, n in enumerate(profile.table_sizes):
        r = np.full(n, -1, dtype=dtype)
        mine = np.sort(chosen_r[chosen_t == t])
        r[mine] = np.arange(offset, offset + mine.size, dtype=dtype)
        offset += mine.size
        remaps.append(r)
    plan = PlacementPlan(
        list(profile.feature_names), list(profile.table_sizes), list(dims), optimizer.kind, remaps,
        int(device_budget), host_budget,
    )  # fmt: skip
    plan.report = placement_report(plan, profile)
    return plan


def placement_report(plan: PlacementPlan, profile: AccessProfile) -> dict:
    """Hot rows per table and, measured on the profile's sample, the share of lookups that are hot
    and the share of inputs whose lookups are all hot (in-sample: optimistic for unseen data)."""
    per_table = []
    hot_lookups = total_lookups = 0
    for t, (r, c) in enumerate(zip(plan.remaps, profile.counts)):
        h = int(c[r >= 0].sum())
        n = int(c.sum())
        hot_lookups += h
        total_lookups += n
        per_table.append({
            "feature": plan.feature_names[t], "rows": plan.table_sizes[t], "hot_rows": int((r >= 0).sum()),
            "hot_lookup_share": h / n if n else None,
        })  # fmt: skip
    inputs = profile.kept_inputs
    hot_in = (
        hot_input_mask(plan, profile.sample_lengths, profile.sample_values)
        if inputs
        else np.zeros(0, bool)
    )
    return {
        "hot_rows": plan.num_hot,
        "device_bytes": plan.device_bytes(),
        "hot_lookup_share": hot_lookups / total_lookups if total_lookups else None,
        "hot_input_share": float(hot_in.mean()) if inputs else None,
        "inputs_measured": int(inputs),
        "tables": per_table,
    }


def hot_input_mask(plan: PlacementPlan, lengths: np.ndarray, values: np.ndarray) -> np.ndarray:
    """bool [n]: input i is hot when every one of its lookups (all features) is a hot row.

    `lengths` [T, n] lookups per (feature, input), `values` the ids, table-major."""
    T, n = lengths.shape
    remap, base = plan.concatenated_remap()
    per_table = lengths.sum(axis=1)
    gid = values + np.repeat(base, per_table)
    cold = remap[gid] < 0
    sample = np.tile(np.arange(n), T)
    owner = np.repeat(sample, lengths.reshape(-1))
    return np.bincount(owner, weights=cold, minlength=n) == 0


def all_hot_plan(
    feature_names: list[str], table_sizes: list[int], dims: list[int], optimizer: SparseOptimizer
) -> PlacementPlan:
    """Every row hot (what `--placement device` means, as a plan, for reports and budgets)."""
    remaps, offset = [], 0
    dtype = remap_dtype(sum(table_sizes))
    for n in table_sizes:
        remaps.append(np.arange(offset, offset + n, dtype=dtype))
        offset += n
    budget = sum(n * row_bytes(d, optimizer) for n, d in zip(table_sizes, dims))
    return PlacementPlan(
        list(feature_names), list(table_sizes), list(dims), optimizer.kind, remaps, budget
    )


def fits_on_device(
    table_sizes: list[int], dims: list[int], optimizer: SparseOptimizer, budget: int
) -> bool:
    return sum(n * row_bytes(d, optimizer) for n, d in zip(table_sizes, dims)) <= budget


__all__ = [
    "PlacementError", "PlacementPlan", "all_hot_plan", "fits_on_device", "hot_input_mask",
    "parse_bytes", "plan_placement", "row_bytes",
]  # fmt: skip
