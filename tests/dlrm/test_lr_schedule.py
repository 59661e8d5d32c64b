import torch

from dlrm.lr_schedule import learning_rate_at


class ReferencePolicy(torch.optim.lr_scheduler._LRScheduler):
    """facebookresearch/dlrm's LRPolicyScheduler, transcribed, for comparison."""

    def __init__(self, optimizer, num_warm, decay_start_step, num_decay_steps):
        self.num_warm = num_warm
        self.decay_start_step = decay_start_step
        self.decay_end_step = decay_start_step + num_decay_steps
        self.num_decay_steps = num_decay_steps
        super().__init__(optimizer)

    def get_lr(self):
        step_count = self._step_count
        if step_count < self.num_warm:
            scale = 1.0 - (self.num_warm - step_count) / self.num_warm
            lr = [base_lr * scale for base_lr in self.base_lrs]
            self.last_lr = lr
        elif self.decay_start_step <= step_count and step_count < self.decay_end_step:
            decayed_steps = step_count - self.decay_start_step
            scale = ((self.num_decay_steps - decayed_steps) / self.num_decay_steps) ** 2
            lr = [max(0.0000001, base_lr * scale) for base_lr in self.base_lrs]
            self.last_lr = lr
        else:
            lr = self.last_lr if self.num_decay_steps > 0 else self.base_lrs
        return lr


def reference_rates(base, warm, start, decay, steps):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=base)
    sched = ReferencePolicy(opt, warm, start, decay)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_matches_reference_policy_warmup_then_decay():
    # decay starting right where the warm-up ends: the reference and we agree at every step
    ref = reference_rates(0.5, 10, 10, 20, 40)
    ours = [learning_rate_at(s, 0.5, 10, 10, 20) for s in range(40)]
    assert ours == ref


def test_constant_without_policy_and_warmup_only():
    assert [learning_rate_at(s, 0.1, 0, 0, 0) for s in range(5)] == [0.1] * 5
    assert [learning_rate_at(s, 1.0, 4, 0, 0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_rate_stays_at_its_last_decayed_value():
    last = learning_rate_at(29, 0.5, 10, 10, 20)
    assert last == 0.5 * (1 / 20) ** 2
    assert learning_rate_at(500, 0.5, 10, 10, 20) == last
