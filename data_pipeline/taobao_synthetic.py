"""Synthetic `UserBehavior.csv` files with a planted sequential signal, for tests and demos.

Every user walks over categories: the next event's category is, with probability `follow`,
one of the user's last `recent` categories (uniformly), otherwise a uniformly random category;
the item is drawn within the category (uniformly, or Zipf-skewed with `item_zipf`). Categories
are uniform in the long run and users have no fixed taste, so the candidate item alone (with the
user's id) says little about whether it is the real next item; the recent history says a lot.
That is the gap TBSM must show over a DLRM on the candidate alone.

Timestamps are strictly increasing per user and spread over `days` days from `start_time`
(2017-11-25, as in the real data), so every time-based split cuts through every user. Lines are
written in blocks of users, shuffled within each block (the preprocessing must not rely on the
file's order). Raw ids are random distinct integers, as sparse as the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybrid_dlrm.common.atomic import write_text

from .taobao_format import BEHAVIORS

_BEHAVIOR_P = (0.895, 0.02, 0.055, 0.03)  # pv, buy, cart, fav: about the real shares
BAD_KINDS = ("field_count", "user_id", "behavior_type", "timestamp")


@dataclass(frozen=True)
class PlantedBehavior:
    num_users: int = 2000
    min_events: int = 30
    max_events: int = 60
    num_categories: int = 50
    items_per_category: int = 40
    recent: int = 5
    follow: float = 0.8
    item_zipf: float = 0.0
    start_time: int = 1511539200
    days: int = 9
    seed: int = 0

    @property
    def num_items(self) -> int:
        return self.num_categories * self.items_per_category


def _distinct_ids(rng: np.random.Generator, n: int, high: int) -> np.ndarray:
    return rng.choice(high, size=n, replace=False).astype(np.int64) + 1


def generate_events(spec: PlantedBehavior) -> dict[str, np.ndarray]:
    """All events as raw-id columns, users in order, each user's events in time order."""
    rng = np.random.default_rng(spec.seed)
    U, L, C = spec.num_users, spec.max_events, spec.num_categories
    cats = np.empty((U, L), dtype=np.int64)
    cats[:, 0] = rng.integers(0, C, U)
    for s in range(1, L):
        back = rng.integers(1, min(s, spec.recent) + 1, U)
        follow = rng.random(U) < spec.follow
        cats[:, s] = np.where(follow, cats[np.arange(U), s - back], rng.integers(0, C, U))
    ipc = spec.items_per_category
    if spec.item_zipf > 0:
        p = 1.0 / np.arange(1, ipc + 1) ** spec.item_zipf
        local = rng.choice(ipc, size=(U, L), p=p / p.sum())
    else:
        local = rng.integers(0, ipc, (U, L))
    items = cats * ipc + local
    lengths = rng.integers(spec.min_events, spec.max_events + 1, U)
    span = spec.days * 86400 - L
    frac = np.sort(rng.random((U, L)), axis=1)
    times = (
        spec.start_time + np.floor(frac * span).astype(np.int64) + np.arange(L)
    )  # strictly increasing
    behaviors = rng.choice(len(BEHAVIORS), size=(U, L), p=_BEHAVIOR_P)
    user_raw = _distinct_ids(rng, U, 10 * U + 1000)
    item_raw = _distinct_ids(rng, spec.num_items, 50 * spec.num_items + 1000)
    cat_raw = _distinct_ids(rng, C, 100 * C + 1000)
    keep = np.arange(L)[None, :] < lengths[:, None]
    return {
        "user": np.broadcast_to(user_raw[:, None], (U, L))[keep],
        "item": item_raw[items][keep],
        "category": cat_raw[cats][keep],
        "behavior": behaviors[keep],
        "timestamp": times[keep],
    }


def write_user_behavior(
    path: str | Path,
    spec: PlantedBehavior = PlantedBehavior(),
    bad_lines: dict[str, int] | None = None,
    users_per_block: int = 500,
) -> dict:
    """Write the raw CSV (atomically); returns a summary: lines, events and the 1-based line
    numbers of any injected malformed lines (`bad_lines` = {kind: count}, kinds BAD_KINDS)."""
    path = Path(path)
    ev = generate_events(spec)
    rng = np.random.default_rng(spec.seed + 1)
    n = len(ev["user"])
    user_starts = np.flatnonzero(np.concatenate(([True], ev["user"][1:] != ev["user"][:-1])))
    block_starts = np.append(user_starts[::users_per_block], n)
    order = np.concatenate(
        [lo + rng.permutation(hi - lo) for lo, hi in zip(block_starts[:-1], block_starts[1:])]
    )
    lines = [
        f"{u},{i},{c},{BEHAVIORS[b]},{t}"
        for u, i, c, b, t in zip(
            *(ev[k][order].tolist() for k in ("user", "item", "category", "behavior", "timestamp"))
        )
    ]
    bad_at: dict[str, list[int]] = {}
    for kind, count in (bad_lines or {}).items():
        if kind not in BAD_KINDS:
            raise ValueError(
                f"unknown bad-line kind {kind!r}: expected one of {', '.join(BAD_KINDS)}"
            )
        for _ in range(count):
            at = int(rng.integers(0, len(lines) + 1))
            lines.insert(at, {"field_count": "1,2,3,pv", "user_id": "u7,2,3,pv,1511539200",
                              "behavior_type": "1,2,3,click,1511539200",
                              "timestamp": "1,2,3,pv,"}[kind])  # fmt: skip
            bad_at.setdefault(kind, []).append(at)
    # positions shift as later lines are inserted before earlier ones: find them afterwards
    bad_text = {"1,2,3,pv": "field_count", "u7,2,3,pv,1511539200": "user_id",
                "1,2,3,click,1511539200": "behavior_type", "1,2,3,pv,": "timestamp"}  # fmt: skip
    found: dict[str, list[int]] = {}
    if bad_at:
        for number, line in enumerate(lines, start=1):
            kind = bad_text.get(line)
            if kind:
                found.setdefault(kind, []).append(number)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "\n".join(lines) + "\n")
    return {
        "path": str(path),
        "lines": len(lines),
        "events": n,
        "users": spec.num_users,
        "bad_lines": found,
    }
