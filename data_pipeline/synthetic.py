"""Criteo-shaped synthetic batches with a planted model, generated on demand at millions/s.

A `PlantedWorld` is a fixed, seeded "true" click model. Each split is an endless stream of samples
made in chunks of CHUNK; chunk k is a pure function of (seed, split, k), and batch i is samples
[i*B, (i+1)*B) of the stream. So data order is reproducible, resumable from any step and
shardable across ranks for free (rank r of W reads the r-th contiguous B/W of each global batch,
so W processes train on exactly the samples one process would), and nothing is stored but the
planted parameters.

Sparse ids: per table a Zipf(alpha) draw over ranks 1..n (inverse CDF of the continuous bounded
power law, floored); id = rank - 1, so row 0 is the hottest, as in a dataset whose ids were
assigned by descending frequency (our preprocessing's frequency mode does exactly that). The
inverse CDF is tabulated at ZIPF_KNOTS points and interpolated linearly: exact for the hot head,
piecewise uniform within the last knots of the cold tail; it saves two transcendental calls a
lookup, which were most of the generator's time.

Labels: Bernoulli(sigmoid(logit)) with
    logit = bias + sum_t s_t * u_t(row_t)                         (per-row effects, hashed)
          + sum_{(a,b) in pairs} <v_a(row_a), v_b(row_b)>         (low-rank interactions, hashed)
          + g(dense)                                              (dense effect, non-linear)
A DLRM can represent all three: row effects through the embeddings and top MLP, the pairs through
the dot interaction, g through the bottom MLP.

Multi-hot bags (`multi_hot_sizes`, one size k_t per table): table t's bag holds k_t independent
Zipf draws, and the planted model reads the bag's pooled (summed) rows, as a DLRM with sum
pooling sees them: the row effect is s_t * sum_j u_t(row_j) / k_t and a pair's term is
<sum_j v_a(row_aj), sum_l v_b(row_bl)> / (k_a k_b): linear in each table's pooled rows, and the
1/k_t is a per-table constant a sum-pooled table absorbs into its rows. Means, not sums: a Zipf
bag often repeats its hot rows, and summed repeats (even scaled by 1/sqrt(k)) pushed the base
rate of MLPerf's sizes from 0.25 to 0.7. The
bag kernel draws draw j of table t from position off_t + j of the sample's counter, so with every
k_t = 1 it makes exactly the one-hot kernel's samples (a test checks); one-hot data still takes
the one-hot kernel, so it is unchanged bit for bit.

The per-sample work is one fused numba loop (parallel over samples): in eager PyTorch the same
arithmetic is ~70 small ops per chunk and tops out near 300k samples/s on two cores. Random bits
are counter-based: a 32-bit hash of (chunk key + position).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numba
import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

# Rows per categorical feature of Criteo Kaggle (facebookresearch/dlrm preprocessing, no cap).
KAGGLE_TABLE_SIZES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
NUM_DENSE = 13
SPLITS = {"train": 0, "val": 1, "test": 2}
CHUNK = 8192
MAX_ROWS = 2**31 - 1  # rows of a table: the generator's limit (SyntheticConfig)
ZIPF_KNOTS = 4096
_M32 = 0xFFFFFFFF


def scaled_table_sizes(scale: float, sizes: list[int] = KAGGLE_TABLE_SIZES) -> list[int]:
    """Kaggle's table sizes multiplied by `scale` (< 1 to shrink), each at least 2 rows."""
    return [max(2, int(round(n * scale))) for n in sizes]


@numba.njit(cache=True, inline="always")
def _hash32(x):
    """lowbias32: a 32-bit integer hash, computed in uint64 and masked."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


@numba.njit(cache=True, inline="always")
def _unit(h):
    """32 hash bits -> uniform in (0, 1)."""
    return (h + 0.5) * 2.3283064365386963e-10


@numba.njit(cache=True, inline="always")
def _lane(h, k):
    """k-th signed 16-bit lane of a 32-bit hash, scaled to [-1, 1)."""
    v = (h >> (16 * k)) & 0xFFFF
    return (v - 65536.0 if v >= 32768 else float(v)) * (1.0 / 32768.0)


@numba.njit(cache=True, inline="always")
def _zipf_row(h, quantiles, t, n_knots, rows):
    """Table t's row for 32 hash bits `h`: the tabulated inverse CDF (module docstring),
    interpolated between knots; rank - 1, so row 0 is the hottest."""
    pos = _unit(h) * n_knots
    k = int(pos)
    x = quantiles[t, k] + (pos - k) * (quantiles[t, k + 1] - quantiles[t, k])
    return min(max(int(math.floor(x)) - 1, 0), rows - 1)


@numba.njit(cache=True, inline="always")
def _dense_and_label(
    i, logit, k_dense, k_miss, k_label, dense_mu, dense_sigma, dense_w, dense_w2, dense_effect,
    mu_log, log1p_small, dense_out, labels_out,
):  # fmt: skip
    """Sample i's dense features (written to dense_out[i]) and its label, drawn from `logit`
    plus the dense effect: the part both kernels (one-hot and bags) share."""
    n_dense = dense_mu.shape[0]
    z1 = 0.0
    z2 = 0.0
    for j in range(n_dense):
        h = _hash32(k_dense + i * n_dense + j)
        # Irwin-Hall: the sum of four 8-bit uniforms is close enough to normal for counts
        # and needs no transcendental calls (Box-Muller needed three).
        s4 = (h & 255) + ((h >> 8) & 255) + ((h >> 16) & 255) + ((h >> 24) & 255)
        z = (s4 - 510.0) * 0.0067664  # mean 0, sd 1: sd of s4 is sqrt(4 * (256**2 - 1) / 12)
        v = 0.0
        if (_hash32(k_miss + i * n_dense + j) & 255) >= 26:  # about 10% missing
            y = dense_mu[j] + dense_sigma[j] * z
            if y > 0.0:  # exp(y) < 1 counts as 0
                c = int(math.exp(y))
                v = log1p_small[c] if c < log1p_small.shape[0] else math.log1p(c)
        dense_out[i, j] = v
        zd = (v - mu_log[j]) / 1.5
        z1 += zd * dense_w[j]
        z2 += zd * dense_w2[j]
    logit += dense_effect * (math.tanh(z1) + 0.5 * z2 * z2 - 0.5)
    labels_out[i] = 1.0 if _unit(_hash32(k_label + i)) < 1.0 / (1.0 + math.exp(-logit)) else 0.0


@numba.njit(cache=True, parallel=True)
def _chunk_kernel(
    key, n_samples, quantiles, n_rows, strength, salt,
    pair_a, pair_b, pair_salt, dense_mu, dense_sigma, dense_w, dense_w2,
    bias, pair_scale, dense_effect, rows_out, dense_out, labels_out,
):  # fmt: skip
    n_tables = quantiles.shape[0]
    n_pairs = pair_a.shape[0]
    mu_log = np.log1p(dense_mu)
    log1p_small = np.log1p(np.arange(4096.0)).astype(np.float32)
    n_knots = quantiles.shape[1] - 1
    k_rows, k_dense, k_miss, k_label = key, key + 0x3C6EF372, key + 0x78DDE6E4, key + 0x1B873593
    for i in numba.prange(n_samples):
        logit = bias
        for t in range(n_tables):
            r = _zipf_row(_hash32(k_rows + i * n_tables + t), quantiles, t, n_knots, n_rows[t])
            rows_out[t, i] = r
            logit += strength[t] * (2.0 * _unit(_hash32(r + salt[t])) - 1.0)
        dot = 0.0
        for p in range(n_pairs):
            ra, rb = rows_out[pair_a[p], i], rows_out[pair_b[p], i]
            for half in range(2):
                ha = _hash32(ra + pair_salt[p, 0] + half * 0x5BD1E995)
                hb = _hash32(rb + pair_salt[p, 1] + half * 0x5BD1E995)
                dot += _lane(ha, 0) * _lane(hb, 0) + _lane(ha, 1) * _lane(hb, 1)
        logit += pair_scale * dot
        _dense_and_label(i, logit, k_dense, k_miss, k_label, dense_mu, dense_sigma, dense_w,
                         dense_w2, dense_effect, mu_log, log1p_small, dense_out, labels_out)  # fmt: skip


@numba.njit(cache=True, parallel=True)
def _bag_chunk_kernel(
    key, n_samples, quantiles, n_rows, bag_size, bag_start, strength, salt,
    pair_a, pair_b, pair_salt, dense_mu, dense_sigma, dense_w, dense_w2,
    bias, pair_scale, dense_effect, ids_out, dense_out, labels_out,
):  # fmt: skip
    """_chunk_kernel with bags: ids_out [sum(bag_size), n] (table t's draws at rows
    bag_start[t] ..); the same arithmetic in the same order when every bag has one id."""
    n_tables = quantiles.shape[0]
    n_ids = ids_out.shape[0]
    n_pairs = pair_a.shape[0]
    mu_log = np.log1p(dense_mu)
    log1p_small = np.log1p(np.arange(4096.0)).astype(np.float32)
    n_knots = quantiles.shape[1] - 1
    k_rows, k_dense, k_miss, k_label = key, key + 0x3C6EF372, key + 0x78DDE6E4, key + 0x1B873593
    for i in numba.prange(n_samples):
        logit = bias
        for t in range(n_tables):
            effect = 0.0
            for j in range(bag_size[t]):
                c = bag_start[t] + j
                r = _zipf_row(_hash32(k_rows + i * n_ids + c), quantiles, t, n_knots, n_rows[t])
                ids_out[c, i] = r
                effect += 2.0 * _unit(_hash32(r + salt[t])) - 1.0
            if bag_size[t] == 1:
                logit += strength[t] * effect
            else:
                logit += strength[t] * effect / bag_size[t]
        dot = 0.0
        for p in range(n_pairs):
            ta, tb = pair_a[p], pair_b[p]
            for half in range(2):
                a0 = a1 = b0 = b1 = 0.0  # the pooled rows' two lanes of this half
                for j in range(bag_size[ta]):
                    ha = _hash32(
                        ids_out[bag_start[ta] + j, i] + pair_salt[p, 0] + half * 0x5BD1E995
                    )
                    a0 += _lane(ha, 0)
                    a1 += _lane(ha, 1)
                for j in range(bag_size[tb]):
                    hb = _hash32(
                        ids_out[bag_start[tb] + j, i] + pair_salt[p, 1] + half * 0x5BD1E995
                    )
                    b0 += _lane(hb, 0)
                    b1 += _lane(hb, 1)
                if bag_size[ta] == 1 and bag_size[tb] == 1:
                    dot += a0 * b0 + a1 * b1
                else:
                    dot += (a0 * b0 + a1 * b1) / (bag_size[ta] * bag_size[tb])
        logit += pair_scale * dot
        _dense_and_label(i, logit, k_dense, k_miss, k_label, dense_mu, dense_sigma, dense_w,
                         dense_w2, dense_effect, mu_log, log1p_small, dense_out, labels_out)  # fmt: skip


def _mix64(x: int) -> int:
    """splitmix64 finaliser, for deriving chunk keys from (seed, split, index, shard)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


@dataclass
class SyntheticConfig:
    table_sizes: list[int] = field(default_factory=lambda: list(KAGGLE_TABLE_SIZES))
    num_dense: int = NUM_DENSE
    zipf_alpha: float | list[float] = 1.05
    seed: int = 0
    # planted model strength; base rate about 0.25 like Criteo
    bias: float = -1.4
    row_effect: float = 0.7
    num_pairs: int = 8
    pair_effect: float = 0.8
    dense_effect: float = 0.8
    # ids per bag, one per table (None: one id per feature, the one-hot kernel)
    multi_hot_sizes: list[int] | None = None

    def __post_init__(self) -> None:
        if not self.table_sizes or min(self.table_sizes) < 1:
            raise ValueError("synthetic data: every table needs at least one row")
        if max(self.table_sizes) > MAX_ROWS:
            raise ValueError("synthetic data: tables are limited to 2**31 - 1 rows")
        alphas = self.alphas()
        if len(alphas) != len(self.table_sizes) or min(alphas) < 0:
            raise ValueError(
                "synthetic data: one non-negative Zipf exponent per table (or one for all)"
            )
        if self.multi_hot_sizes is not None and (
            len(self.multi_hot_sizes) != len(self.table_sizes) or min(self.multi_hot_sizes) < 1
        ):
            raise ValueError("synthetic data: one bag size >= 1 per table")

    def alphas(self) -> list[float]:
        if isinstance(self.zipf_alpha, (int, float)):
            return [float(self.zipf_alpha)] * len(self.table_sizes)
        return [float(a) for a in self.zipf_alpha]


class PlantedWorld:
    """The seeded true model; draws any chunk of any split by index."""

    def __init__(self, cfg: SyntheticConfig) -> None:
        self.cfg = cfg
        n_tables = len(cfg.table_sizes)
        rng = np.random.default_rng(cfg.seed)
        self.n_rows = np.array(cfg.table_sizes, dtype=np.int64)
        # Zipf inverse CDF in log space; alpha = 1 is the limit 1 - alpha -> 0, approached
        # closely enough (1e-4) that the difference is far below sampling noise.
        om = 1.0 - np.array(cfg.alphas(), dtype=np.float64)[:, None]
        om = np.where(np.abs(om) < 1e-4, 1e-4, om)
        span = (self.n_rows[:, None] + 1.0) ** om - 1.0
        u = np.linspace(0.0, 1.0, ZIPF_KNOTS + 1)[None, :]
        self.quantiles = np.exp(np.log1p(u * span) / om)  # [T, knots + 1], x(u) in [1, n + 1]
        # Per-row effects are hashed from (table, row): nothing stored, no cache misses.
        self.strength = cfg.row_effect * (0.2 + 0.8 * rng.random(n_tables))
        self.salt = rng.integers(1, 2**31, n_tables, dtype=np.int64)
        pairs = rng.integers(0, n_tables, (cfg.num_pairs, 2))
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        self.pair_a, self.pair_b = pairs[:, 0].copy(), pairs[:, 1].copy()
        self.pair_salt = rng.integers(1, 2**31, (len(pairs), 2), dtype=np.int64)
        self.pair_scale = cfg.pair_effect / math.sqrt(4 * max(len(pairs), 1) / 9.0)
        self.dense_mu = rng.random(cfg.num_dense) * 3.0
        self.dense_sigma = 0.5 + rng.random(cfg.num_dense)
        self.dense_w = rng.standard_normal(cfg.num_dense) / math.sqrt(cfg.num_dense)
        self.dense_w2 = rng.standard_normal(cfg.num_dense) / math.sqrt(cfg.num_dense)
        self.feature_names = [f"cat_{i}" for i in range(n_tables)]
        self._layout: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        sizes = cfg.multi_hot_sizes
        self.bag_sizes = None if sizes is None else np.array(sizes, dtype=np.int64)

    def chunk_key(self, split: str, index: int, shard: int = 0) -> int:
        x = _mix64(self.cfg.seed)
        for part in (SPLITS[split], shard, index):
            x = _mix64(x ^ part)
        return x & 0x7FFFFFFF

    def chunk(
        self, split: str, index: int, shard: int = 0, kernel: str | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Chunk `index` of a split's stream: ids [sum of bag sizes (one-hot: T), CHUNK] int64
        (table t's draws in rows bag_starts[t] ..), dense [CHUNK, D], labels. `kernel` "bags"
        runs the bag kernel on one-hot data (tests compare the two)."""
        sizes = self.bag_sizes
        if sizes is None and kernel == "bags":
            sizes = np.ones(len(self.n_rows), dtype=np.int64)
        rows = np.empty((len(self.n_rows) if sizes is None else int(sizes.sum()), CHUNK), np.int64)
        dense = np.empty((CHUNK, self.cfg.num_dense), dtype=np.float32)
        labels = np.empty(CHUNK, dtype=np.float32)
        threads = torch.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        key = self.chunk_key(split, index, shard)
        if sizes is None:
            _chunk_kernel(
                key, CHUNK, self.quantiles, self.n_rows,
                self.strength, self.salt, self.pair_a, self.pair_b, self.pair_salt,
                self.dense_mu, self.dense_sigma, self.dense_w, self.dense_w2,
                self.cfg.bias, self.pair_scale, self.cfg.dense_effect, rows, dense, labels,
            )  # fmt: skip
        else:
            starts = np.cumsum([0, *sizes])[:-1].astype(np.int64)
            _bag_chunk_kernel(
                key, CHUNK, self.quantiles, self.n_rows, sizes, starts,
                self.strength, self.salt, self.pair_a, self.pair_b, self.pair_salt,
                self.dense_mu, self.dense_sigma, self.dense_w, self.dense_w2,
                self.cfg.bias, self.pair_scale, self.cfg.dense_effect, rows, dense, labels,
            )  # fmt: skip
        # numba's OpenMP threading layer sets the process's OpenMP thread count to its own (all
        # cores) when it runs: two torchrun workers of one thread each then ran two threads each
        # on two cores, ~10x slower steps under load (docs/distributed.md)
        torch.set_num_threads(threads)
        return torch.from_numpy(rows), torch.from_numpy(dense), torch.from_numpy(labels)

    def make_batch(self, rows: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> Batch:
        return Batch(dense_features=dense, sparse_features=self._kjt(rows), labels=labels)

    def _kjt(self, rows: torch.Tensor) -> KeyedJaggedTensor:
        if self.bag_sizes is not None:
            return bags_kjt(self.feature_names, rows.numpy(), self.bag_sizes)
        n_tables, batch = rows.shape
        if batch not in self._layout:  # one id per feature per sample: fixed lengths/offsets
            self._layout[batch] = (
                torch.ones(n_tables * batch, dtype=torch.int32),
                torch.arange(n_tables * batch + 1, dtype=torch.int64),
            )
        lengths, offsets = self._layout[batch]
        return KeyedJaggedTensor(
            keys=self.feature_names,
            values=rows.reshape(-1),
            lengths=lengths,
            offsets=offsets,
            stride=batch,
        )


def bags_kjt(
    names: list[str], ids: np.ndarray, sizes: np.ndarray, index_dtype: np.dtype | None = None
) -> KeyedJaggedTensor:
    """A KJT of fixed-size bags from ids [sum(sizes), B] (table t's k_t ids per sample in rows
    start_t .. start_t + k_t): feature t's values are its [k_t, B] block transposed, so each
    bag's ids are contiguous. One copy per table, never per sample."""
    batch = ids.shape[1]
    values = np.empty(ids.size, dtype=index_dtype or ids.dtype)
    lo = 0
    for start, k in zip(np.cumsum([0, *sizes[:-1]]), sizes):
        values[lo : lo + k * batch].reshape(batch, k)[:] = ids[start : start + k].T
        lo += k * batch
    return KeyedJaggedTensor(
        keys=names,
        values=torch.from_numpy(values),
        lengths=torch.from_numpy(np.repeat(np.asarray(sizes, dtype=np.int32), batch)),
        stride=batch,
    )


class SyntheticBatchSource:
    """A `BatchSource` over one split of a planted world: `num_batches` batches per epoch.

    Every epoch sees new samples (the world is infinite); `rank`/`world_size` split each global
    batch of `batch_size` into equal contiguous shards (rank r: samples [r*B/W, (r+1)*B/W) of it).
    """

    def __init__(
        self,
        world: PlantedWorld,
        split: str,
        batch_size: int,
        num_batches: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
        if batch_size < 1 or num_batches < 1:
            raise ValueError("synthetic data: batch size and number of batches must be >= 1")
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} does not split over {world_size} ranks")
        self.world = world
        self.split = split
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.rank, self.world_size = rank, world_size
        self.num_dense = world.cfg.num_dense
        self.table_sizes = list(world.cfg.table_sizes)
        self.feature_names = list(world.feature_names)
        self._cached_index = -1
        self._cached: tuple[torch.Tensor, ...] = ()

    def __len__(self) -> int:
        return self.num_batches

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        if not 0 <= start <= self.num_batches:
            raise IndexError(f"start batch {start} of {self.num_batches}")
        for i in range(start, self.num_batches):
            yield self.batch(epoch, i)

    def batch(self, epoch: int, index: int) -> Batch:
        """Batch `index` of `epoch` (this rank's shard of it). Epochs are consecutive stretches
        of one endless stream, so no two epochs repeat a batch."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of {self.num_batches}")
        index += epoch * self.num_batches
        local = self.batch_size // self.world_size
        lo = index * self.batch_size + self.rank * local
        hi = lo + local
        parts = []
        while lo < hi:
            k = lo // CHUNK
            if self._cached_index != k:
                self._cached = self.world.chunk(self.split, k)
                self._cached_index = k
            a, b = lo - k * CHUNK, min(hi - k * CHUNK, CHUNK)
            rows, dense, labels = self._cached
            parts.append((rows[:, a:b], dense[a:b], labels[a:b]))
            lo += b - a
        if len(parts) == 1:
            rows, dense, labels = parts[0]
        else:
            rows, dense, labels = (torch.cat(p, dim=d) for p, d in zip(zip(*parts), (1, 0, 0)))
        return self.world.make_batch(rows.contiguous(), dense, labels)
