"""The reference's learning-rate policy (facebookresearch/dlrm LRPolicyScheduler) as a pure
function of the step, so a resumed run needs nothing but the step count to continue it.

- warm-up: lr * step / warmup for step < warmup
- decay: from `decay_start` for `num_decay` steps, lr * ((num_decay - k) / num_decay) ** 2,
  floored at 1e-7; after the decay the rate stays at its last value (the reference "freezes").
- otherwise the base rate.
"""

from __future__ import annotations

MIN_DECAYED_LR = 1e-7


def learning_rate_at(
    step: int, base: float, warmup: int, decay_start: int, num_decay: int
) -> float:
    """The rate for the update made at 0-based `step`."""
    # The reference counts steps from 1 (its scheduler's _step_count starts at 1).
    count = step + 1
    if count < warmup:
        return base * (1.0 - (warmup - count) / warmup)  # the reference's arithmetic, bit for bit
    decay_end = decay_start + num_decay
    if num_decay > 0 and count >= decay_start:
        done = min(count, decay_end - 1) - decay_start
        scale = ((num_decay - done) / num_decay) ** 2
        return max(MIN_DECAYED_LR, base * scale)
    return base
