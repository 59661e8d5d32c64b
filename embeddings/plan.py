"""Placement plans: which embedding rows each tier holds (device, host, later SSD), as data and files.

A plan lists its tiers fastest first, each with a byte budget (weights AND optimizer state, or
None) and its rows, given one of three ways:
- `explicit`: per table an integer remap array, remap[row] = the row's slot in the tier, -1 = not
  here; slots are the tier's tables back to back (table t's rows on offset_t ... offset_t + n_t - 1).
  Or, in the *sparse form* (`TierPlan.held`), per table the sorted ids of the rows held, a row's
  slot being offset_t + its rank: 4 bytes per held row instead of 4 for every row (the device
  remaps of the Terabyte tables are 1.04 GB dense, 64 MB sparse for 16M hot rows). `plan_placement`
  makes the sparse form where `hot_map.use_dense` says a dense map is not worth its bytes; `remaps`
  and `tier_remaps` materialise the dense arrays for the callers that need them (FAE, Slipstream);
  `hot_ids`, `held_rows`, the byte counts, files and validation use either form as it is;
- `all`: every row (FAE's host tier, which keeps a replica of every device row);
- `rest`: every row not held by a faster tier (one-home placements: Hotline, an SSD tier).
`replicated` says whether a row may live in two tiers at once (FAE) or has exactly one home.
Remap arrays are integers (int32 while the tier has < 2**31 rows, else int64), never floats,
which lose row ids beyond 2**24 (a bug of the original FAE code).

Files are `.npz` (no pickle) holding the remap arrays and the metadata as JSON, with a `.json`
copy of the metadata for people; zip's CRC-32 of every member is checked when it is read, so a
corrupt or truncated file is one PlacementError. Version 1 files (a device remap, the host holding
every row) still load; a plan with a sparse tier is written as version 3 (`<tier>_rows_<t>`
arrays; a tier's `form` is "rows"), plans without one as version 2, as before. `embeddings/hot_rows.py` makes plans from access profiles.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embeddings.config import SparseOptimizer
from embeddings.errors import PlacementError, npz_failure
from hybrid_dlrm.common import atomic
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.common.outputs import Purpose, json_format_is, npz_format_is

FORMAT = "hybrid-dlrm/placement-plan"
VERSION = 2
SPARSE_VERSION = 3  # files holding a tier in the sparse form (older code refuses them in one line)
FLOAT_BYTES = 4
# a plan as an output (hybrid_dlrm/common/outputs.py): the pair X.npz and X.json named by one
# stem; an existing X.npz is read (--placement-plan reuses it), and X.json is written only
# beside a new X.npz, over nothing but a plan's own JSON
PLAN_FILES = {
    ".npz": Purpose("placement plan", identify=npz_format_is(FORMAT), reused=True),
    ".json": Purpose("placement plan", identify=json_format_is(FORMAT)),
}
TIER_ORDER = ("device", "host", "ssd")  # fastest first
EXPLICIT, ALL, REST = "explicit", "all", "rest"


def row_bytes(dim: int, optimizer: SparseOptimizer) -> int:
    """Bytes one row occupies in a tier: fp32 weights plus the fused optimizer's state."""
    return (dim + optimizer.state_floats(dim)) * FLOAT_BYTES


def remap_dtype(hot_rows: int) -> np.dtype:
    return np.dtype(np.int32) if hot_rows < 2**31 - 1 else np.dtype(np.int64)


@dataclass
class TierPlan:
    """The rows one tier holds and the bytes it may use (weights + optimizer state)."""

    name: str  # one of TIER_ORDER
    rows: str = EXPLICIT  # EXPLICIT (remaps), ALL or REST
    remaps: list[np.ndarray] | None = None  # EXPLICIT: per table [rows] -> slot in the tier or -1
    budget: int | None = None  # bytes; None = as much as the machine has
    held: list[np.ndarray] | None = None  # EXPLICIT, sparse form: per table sorted row ids held

    @property
    def explicit(self) -> bool:
        return self.rows == EXPLICIT

    def held_ids(self, t: int) -> np.ndarray:
        """Table t's rows in this explicit tier, ascending."""
        if self.held is not None:
            return self.held[t]
        return np.flatnonzero(self.remaps[t] >= 0)

    def held_count(self, t: int) -> int:
        return int(self.held[t].size) if self.held is not None else int((self.remaps[t] >= 0).sum())


@dataclass
class PlacementPlan:
    """Per tier the rows it holds and its budget, for the tables (and optimizer) it was made for.

    `remaps`, `hot_rows`, `num_hot`, `device_budget`, ... are the device tier's (what FAE and the
    trainer use); `tier(name)`, `held_rows`, `tier_remaps`, `tier_bytes` are the generic view."""

    feature_names: list[str]
    table_sizes: list[int]
    dims: list[int]
    optimizer: str
    tiers: list[TierPlan]  # fastest first
    replicated: bool = True  # a row may live in two tiers (FAE's device copy of hot rows)
    report: dict = field(default_factory=dict)
    _concat: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def device_and_host(
        cls,
        feature_names: list[str],
        table_sizes: list[int],
        dims: list[int],
        optimizer: str,
        remaps: list[np.ndarray],
        device_budget: int,
        host_budget: int | None = None,
        report: dict | None = None,
        one_home: bool = False,
        held: list[np.ndarray] | None = None,
    ) -> PlacementPlan:
        """Hot rows (`remaps`, or `held`: the sparse form, remaps None) on the device; the host
        holds every row (FAE's replica), or with `one_home` only the rows the device does not."""
        remaps = None if remaps is None else list(remaps)
        held = None if held is None else list(held)
        tiers = [
            TierPlan("device", EXPLICIT, remaps, int(device_budget), held),
            TierPlan("host", REST if one_home else ALL, None, host_budget),
        ]
        return cls(
            list(feature_names), [int(n) for n in table_sizes], [int(d) for d in dims],
            str(optimizer), tiers, not one_home, dict(report or {}),
        )  # fmt: skip

    # --- tiers --------------------------------------------------------------------------------

    @property
    def tier_names(self) -> list[str]:
        return [t.name for t in self.tiers]

    def tier(self, name: str) -> TierPlan:
        for t in self.tiers:
            if t.name == name:
                return t
        raise PlacementError(
            f"placement plan: no {name} tier (it has {', '.join(self.tier_names)})"
        )

    def _dense(self, tier: TierPlan) -> list[np.ndarray]:
        """An explicit tier's remaps, materialised (and kept) from the sparse form if need be."""
        if tier.remaps is None:
            dtype = remap_dtype(sum(h.size for h in tier.held))
            out, offset = [], 0
            for h, n in zip(tier.held, self.table_sizes):
                r = np.full(n, -1, dtype=dtype)
                r[h] = np.arange(offset, offset + h.size, dtype=dtype)
                offset += h.size
                out.append(r)
            tier.remaps = out
        return tier.remaps

    def _held_masks(self, name: str) -> list[np.ndarray]:
        """Per table a bool mask of the rows tier `name` holds."""
        faster = [np.zeros(n, dtype=bool) for n in self.table_sizes]
        for tier in self.tiers:
            if tier.rows == EXPLICIT:
                held = [r >= 0 for r in self._dense(tier)]
            elif tier.rows == ALL:
                held = [np.ones(n, dtype=bool) for n in self.table_sizes]
            else:
                held = [~f for f in faster]
            if tier.name == name:
                return held
            faster = [f | h for f, h in zip(faster, held)]
        raise PlacementError(
            f"placement plan: no {name} tier (it has {', '.join(self.tier_names)})"
        )

    def held_rows(self, name: str) -> list[int]:
        """Rows per table that tier `name` holds."""
        tier = self.tier(name)
        if tier.rows == EXPLICIT:
            return [tier.held_count(t) for t in range(len(self.table_sizes))]
        if tier.rows == ALL:
            return list(self.table_sizes)
        faster = self.tiers[: self.tier_names.index(name)]
        if any(f.rows == ALL for f in faster):
            return [0] * len(self.table_sizes)
        out = []  # REST: the rows no faster (explicit) tier holds
        for t, n in enumerate(self.table_sizes):
            ids = [f.held_ids(t) for f in faster]
            taken = ids[0].size if len(ids) == 1 else np.unique(np.concatenate(ids or [[]])).size
            out.append(n - int(taken))
        return out

    def tier_remaps(self, name: str) -> list[np.ndarray]:
        """Tier `name`'s rows as explicit remaps (materialised for `all` and `rest` tiers)."""
        tier = self.tier(name)
        if tier.rows == EXPLICIT:
            return self._dense(tier)
        held = self._held_masks(name)
        dtype = remap_dtype(sum(int(m.sum()) for m in held))
        out, offset = [], 0
        for m in held:
            r = np.full(m.size, -1, dtype=dtype)
            k = int(m.sum())
            r[m] = np.arange(offset, offset + k, dtype=dtype)
            offset += k
            out.append(r)
        return out

    def tier_bytes(self, name: str) -> int:
        return sum(h * b for h, b in zip(self.held_rows(name), self.bytes_per_row()))

    # --- the device tier (the accessors dlrm and the scripts use) -------------------------------

    @property
    def remaps(self) -> list[np.ndarray]:
        """Per table [rows]: the row's slot in the device tier (the hot table), -1 = cold
        (materialised from the sparse form on first use: 4 bytes for every row)."""
        return self._dense(self.tier("device"))

    @property
    def device_budget(self) -> int | None:
        return self.tier("device").budget

    @property
    def host_budget(self) -> int | None:
        return self.tier("host").budget if "host" in self.tier_names else None

    @property
    def hot_rows(self) -> list[int]:
        return self.held_rows("device")

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
        return self.tier_bytes("device")

    def host_bytes(self) -> int:
        return self.tier_bytes("host") if "host" in self.tier_names else 0

    def overlap(self, other: PlacementPlan) -> dict:
        """How much of `other`'s hot set this plan's holds (e.g. a hot set learned online
        against the offline profile's): rows in both, and their share of each plan's hot rows."""
        if self.table_sizes != other.table_sizes:
            raise PlacementError("placement plans of different tables cannot be compared")
        common = sum(int(((a >= 0) & (b >= 0)).sum()) for a, b in zip(self.remaps, other.remaps))
        return {
            "common_hot_rows": common,
            "share_of_this": round(common / self.num_hot, 4) if self.num_hot else None,
            "share_of_other": round(common / other.num_hot, 4) if other.num_hot else None,
        }

    def hot_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(table, row) of every hot-table entry, int64, in hot-table order."""
        tables, rows = [], []
        device = self.tier("device")
        for t in range(len(self.table_sizes)):
            ids = device.held_ids(t)  # the sparse form's slot order is row order
            if device.held is None:
                ids = ids[np.argsort(device.remaps[t][ids], kind="stable")]
            tables.append(np.full(ids.size, t, dtype=np.int64))
            rows.append(ids.astype(np.int64))
        return np.concatenate(tables), np.concatenate(rows)

    def concatenated_remap(self) -> tuple[np.ndarray, np.ndarray]:
        """(device remap of all tables back to back, first global row of each table), for one
        gather. Computed once and shared (read-only): on big tables it is gigabytes."""
        if self._concat is None:
            base = np.zeros(len(self.table_sizes), dtype=np.int64)
            base[1:] = np.cumsum(self.table_sizes)[:-1]
            self._concat = (np.concatenate(self.remaps), base)
        return self._concat

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
        tiers = [
            {"name": t.name, "rows": t.rows, "budget": t.budget,
             "rows_per_table": self.held_rows(t.name), "bytes": self.tier_bytes(t.name)}
            | ({"form": "rows"} if t.held is not None else {})
            for t in self.tiers
        ]  # fmt: skip
        sparse = any(t.held is not None for t in self.tiers)
        return {
            "format": FORMAT,
            "version": SPARSE_VERSION if sparse else VERSION,
            "feature_names": self.feature_names,
            "table_sizes": self.table_sizes,
            "dims": self.dims,
            "optimizer": self.optimizer,
            "replicated": self.replicated,
            "tiers": tiers,
            # the device/host summary (version 1's fields), for people and tools reading the JSON
            "device_budget": self.device_budget,
            "host_budget": self.host_budget,
            "hot_rows": self.hot_rows,
            "hot_offsets": self.hot_offsets,
            "bytes_per_row": self.bytes_per_row(),
            "device_bytes": self.device_bytes(),
            "host_bytes": self.host_bytes(),
            "report": self.report,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """The file's arrays: `<tier>_remap_<table>` of every explicit tier (`<tier>_rows_<table>`
        in the sparse form)."""
        out = {}
        for tier in self.tiers:
            if tier.held is not None:
                out.update({f"{tier.name}_rows_{t}": h for t, h in enumerate(tier.held)})
            elif tier.rows == EXPLICIT:
                out.update({f"{tier.name}_remap_{t}": r for t, r in enumerate(tier.remaps)})
        return out

    def save(self, path: str | Path) -> Path:
        """`X.npz` (the remap arrays and the metadata) and `X.json` (the metadata, for people)."""
        path = Path(path).with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = self.meta()
        with atomic.atomic_write(path) as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **self.arrays())
        atomic.write_json(path.with_suffix(".json"), meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> PlacementPlan:
        path = Path(path).with_suffix(".npz")
        if not path.is_file():
            raise PlacementError(f"{path}: no such placement plan")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                check_header(meta, path, format=FORMAT, versions=(SPARSE_VERSION, VERSION, 1),
                             kind="plan", what="placement plan", error=PlacementError)  # fmt: skip
                plan = cls._from_file(meta, z)
        except PlacementError:
            raise
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
            raise PlacementError(
                f"{path}: not a readable placement plan ({npz_failure(e)})"
            ) from None
        plan.validate(str(path))
        return plan

    @classmethod
    def _from_file(cls, meta: dict, z) -> PlacementPlan:
        sizes = [int(n) for n in meta["table_sizes"]]
        common = (
            [str(f) for f in meta["feature_names"]], sizes, [int(d) for d in meta["dims"]],
            str(meta["optimizer"]),
        )  # fmt: skip
        report = dict(meta.get("report", {}))
        if meta["version"] == 1:  # a device remap; the host holds every row, replicated
            remaps = [np.asarray(z[f"remap_{t}"]) for t in range(len(sizes))]
            budget, host = meta["device_budget"], meta.get("host_budget")
            return cls.device_and_host(
                *common, remaps, int(budget), None if host is None else int(host), report
            )
        tiers = []
        for spec in meta["tiers"]:
            name, rows, budget = str(spec["name"]), str(spec["rows"]), spec.get("budget")
            remaps = held = None
            if rows == EXPLICIT and spec.get("form") == "rows":
                held = [np.asarray(z[f"{name}_rows_{t}"]) for t in range(len(sizes))]
            elif rows == EXPLICIT:
                remaps = [np.asarray(z[f"{name}_remap_{t}"]) for t in range(len(sizes))]
            budget = None if budget is None else int(budget)
            tiers.append(TierPlan(name, rows, remaps, budget, held))
        return cls(*common, tiers, bool(meta["replicated"]), report)

    def validate(self, what: str = "placement plan") -> None:
        """Tiers known and fastest first; remaps integer, in range and one slot per held row;
        every row with a home (exactly one unless replicated); every tier within its budget."""
        names = self.tier_names
        if not names or len(set(names)) != len(names) or any(n not in TIER_ORDER for n in names):
            raise PlacementError(
                f"{what}: tiers {names}, expected distinct ones of {list(TIER_ORDER)}"
            )
        if names != sorted(names, key=TIER_ORDER.index):
            raise PlacementError(
                f"{what}: tiers {names} are not fastest first ({list(TIER_ORDER)})"
            )
        for tier in self.tiers:
            self._validate_tier(tier, what)
        covered = any(t.rows != EXPLICIT for t in self.tiers)
        held = np.array([self.held_rows(n) for n in names], dtype=np.int64).reshape(len(names), -1)
        for t, n in enumerate(self.table_sizes):
            if not covered:
                home = np.zeros(n, dtype=bool)
                for tier in self.tiers:
                    home[tier.held_ids(t)] = True
                if not home.all():
                    row = int(np.flatnonzero(~home)[0])
                    raise PlacementError(f"{what}: row {row} of table {t} is in no tier")
            if not self.replicated and held[:, t].sum() != n:
                raise PlacementError(
                    f"{what}: table {t} has rows in two tiers, but the plan says one home per row"
                )
        for tier in self.tiers:
            need = self.tier_bytes(tier.name)
            if tier.budget is not None and need > tier.budget:
                if tier.name == "device":
                    raise PlacementError(
                        f"{what}: hot rows need {need} bytes, over the device budget of {tier.budget}"
                    )
                raise PlacementError(
                    f"{what}: the {tier.name} tier needs {need} bytes, over its budget of {tier.budget}"
                )

    def _validate_tier(self, tier: TierPlan, what: str) -> None:
        if tier.rows not in (EXPLICIT, ALL, REST):
            raise PlacementError(
                f"{what}: {tier.name} tier rows {tier.rows!r}, expected explicit, all or rest"
            )
        given = tier.remaps is not None or tier.held is not None
        if given != (tier.rows == EXPLICIT):
            raise PlacementError(
                f"{what}: {tier.name} tier: remap arrays go with explicit rows only"
            )
        if tier.rows != EXPLICIT:
            return
        if tier.held is not None:
            self._validate_held(tier, what)
            if tier.remaps is None:
                return
        if len(tier.remaps) != len(self.table_sizes):
            raise PlacementError(
                f"{what}: {len(tier.remaps)} {tier.name} remap arrays for {len(self.table_sizes)} tables"
            )
        off = 0
        for t, (r, n) in enumerate(zip(tier.remaps, self.table_sizes)):
            if r.dtype.kind != "i":
                raise PlacementError(
                    f"{what}: {tier.name} remap of table {t} is {r.dtype}, expected signed integers"
                )
            if r.shape != (n,):
                raise PlacementError(
                    f"{what}: {tier.name} remap of table {t} has shape {list(r.shape)}, expected [{n}]"
                )
            held = np.sort(r[r >= 0])
            h = held.size
            if (r < -1).any() or not np.array_equal(
                held, np.arange(off, off + h, dtype=held.dtype)
            ):
                raise PlacementError(
                    f"{what}: {tier.name} remap of table {t} must map its rows onto "
                    f"{off}..{off + h - 1} exactly once (-1 = not in this tier)"
                )
            off += h

    def _validate_held(self, tier: TierPlan, what: str) -> None:
        """The sparse form: per table integer row ids, ascending, unique, inside the table."""
        if len(tier.held) != len(self.table_sizes):
            raise PlacementError(
                f"{what}: {len(tier.held)} {tier.name} row lists for {len(self.table_sizes)} tables"
            )
        for t, (h, n) in enumerate(zip(tier.held, self.table_sizes)):
            if h.dtype.kind != "i" or h.ndim != 1:
                raise PlacementError(
                    f"{what}: {tier.name} rows of table {t} are {h.dtype} {list(h.shape)}, "
                    "expected a list of signed integers"
                )
            if h.size and (h[0] < 0 or h[-1] >= n or (np.diff(h) <= 0).any()):
                raise PlacementError(
                    f"{what}: {tier.name} rows of table {t} must be ascending, unique row ids "
                    f"in 0..{n - 1}"
                )
