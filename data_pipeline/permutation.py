"""Seeded pseudo-random permutations of [0, n) that can be evaluated at any position.

Shuffling a Terabyte split (billions of rows) with `np.random.permutation` would need an int64
table of 8 bytes per row. A keyed Feistel network on the smallest number of bits covering n,
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
    # One multiply-xorshift per round: with 4 rounds and per-round keys this mixes well enough
    # for shuffling training data, at a fraction of a full 64-bit finaliser's cost.
    x = (r ^ key) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(29)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(32)
    return x & mask


class FeistelPermutation:
    """perm(positions) for a fixed (n, key); a bijection of [0, n).

    The network is unbalanced (halves of b//2 and b - b//2 bits, swapping widths each round)
    so its domain is 2**b < 2n: cycle-walking then re-encrypts fewer than half the values."""

    def __init__(self, n: int, key: int, rounds: int = 4):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._widths = (bits // 2, bits - bits // 2)  # (left, right)
        self._keys = [np.uint64(derive_key(key, i)) for i in range(rounds)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        wl, wr = self._widths
        left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
        for k in self._keys:
            left, right = right, left ^ _round(right, k, np.uint64((1 << wl) - 1))
            wl, wr = wr, wl
        return (left << np.uint64(wr)) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        if self.n <= 1:
            return p.copy()
        if p.size and (p.min() < 0 or p.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        y = self._encrypt(p.astype(np.uint64))
        out = np.flatnonzero(y >= np.uint64(self.n))
        while len(out):  # cycle-walking: re-encrypt until inside [0, n)
            y[out] = self._encrypt(y[out])
            out = out[y[out] >= np.uint64(self.n)]
        return y.astype(np.int64)
