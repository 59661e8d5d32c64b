"""Seeded pseudo-random permutations of [0, n) that can be evaluated at any position.

Shuffling a Terabyte split (billions of rows) with `np.random.permutation` would need an int64
table of 8 bytes per row. A keyed Feistel network on the smallest even number of bits covering n,
with cycle-walking (re-encrypt until the value falls below n), is a bijection of [0, n) that
costs O(1) memory and O(batch) work to evaluate for one batch, so any batch of any epoch can be
produced directly: exactly what resuming from a checkpoint needs.
"""

from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def derive_key(*parts: int) -> int:
    """A 64-bit key from small integers (seed, epoch, day, ...), stable across runs."""
    h = 0x6A09E667F3BCC909
    for p in parts:
        h = _splitmix(h ^ (p & _M64))
    return h


def _round(r: np.ndarray, key: np.uint64, mask: np.uint64) -> np.ndarray:
    x = r ^ key
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (x ^ (x >> np.uint64(31))) & mask


class FeistelPermutation:
    """perm(positions) for a fixed (n, key); a bijection of [0, n)."""

    def __init__(self, n: int, key: int, rounds: int = 4):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._half = np.uint64((bits + 1) // 2)
        self._mask = np.uint64((1 << int(self._half)) - 1)
        self._keys = [np.uint64(derive_key(key, i)) for i in range(rounds)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ _round(right, k, self._mask)
        return (left << self._half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        if self.n <= 1:
            return p.copy()
        if p.size and (p.min() < 0 or p.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        y = self._encrypt(p.astype(np.uint64))
        out = np.flatnonzero(y >= np.uint64(self.n))
        # Cycle-walking: the domain is < 4n, so each walk step keeps a value out w.p. < 3/4.
        while len(out):
            y[out] = self._encrypt(y[out])
            out = out[y[out] >= np.uint64(self.n)]
        return y.astype(np.int64)
