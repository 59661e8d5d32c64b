"""The thread count follows the machine's load (dlrm/processes/thread_watch.py): what it reads, what it
decides, and that changing the count between steps leaves the training bit-identical."""

import pytest
import torch

from dlrm import Trainer
from dlrm.pipelines.base import StepHook, StepHooks
from dlrm.processes import threads
from dlrm.processes.thread_watch import (
    SLACK,
    WINDOW_S,
    CpuSampler,
    Reading,
    ThreadWatch,
    busy_seconds,
    fitting_threads,
)


def stat(cpu_ticks: dict[int, tuple[int, ...]]) -> str:
    lines = ["cpu  999 999 999 999 999 999 999 999 0 0"]
    for cpu, t in cpu_ticks.items():
        lines.append(f"cpu{cpu} " + " ".join(str(x) for x in t))
    return "\n".join(lines + ["intr 1 2 3", "ctxt 5"]) + "\n"


def test_busy_seconds_counts_the_non_idle_ticks_of_the_affinity_cpus_only():
    from dlrm.processes import thread_watch

    # user nice system idle iowait irq softirq steal guest guest_nice
    text = stat({0: (100, 10, 20, 500, 70, 1, 2, 3, 50, 0), 1: (7, 0, 0, 9, 0, 0, 0, 0, 0, 0),
                 2: (1000, 0, 0, 0, 0, 0, 0, 0, 0, 0)})  # fmt: skip
    hz = thread_watch._HZ
    # cpu0: user + nice + system + irq + softirq + steal; idle, iowait and guest (inside user) not
    assert busy_seconds(text, {0}) == (100 + 10 + 20 + 1 + 2 + 3) / hz
    assert busy_seconds(text, {0, 1}) == (136 + 7) / hz
    assert busy_seconds(text, {5}) == 0.0  # a CPU the file does not list
    assert busy_seconds(stat({0: (4, 0, 0, 1)}), {0}) == 4 / hz  # an old kernel's short line


def test_others_are_the_busy_time_less_this_process_own_over_the_wall_time():
    a, b = Reading(10.0, 100.0, 5.0), Reading(12.0, 103.0, 6.0)
    assert CpuSampler.others(a, b) == 1.0  # 3 s busy in 2 s, 1 s of it ours: one CPU of others
    assert CpuSampler.others(a, Reading(12.0, 101.0, 7.0)) == 0.0  # never negative
    assert CpuSampler.others(a, Reading(10.01, 200.0, 5.0)) == 0.0  # too close to tell


def test_fitting_threads_leaves_the_cpus_others_keep_busy():
    assert fitting_threads(2, 0.05, 2) == 2  # quiet: daemons and the kernel
    assert fitting_threads(2, SLACK - 0.01, 2) == 2
    assert fitting_threads(2, SLACK + 0.01, 2) == 1  # a part-time neighbour: one thread
    assert fitting_threads(2, 1.0, 2) == 1  # one CPU-bound neighbour
    assert fitting_threads(2, 2.0, 2) == 1  # never below one
    assert fitting_threads(8, 3.0, 8) == 5
    assert fitting_threads(8, 0.0, 4) == 4  # never above the automatic choice (e.g. a quota)


class FakeMachine:
    """A sampler whose clock and loads the test moves: `others` CPUs busy besides our `ours`."""

    def __init__(self, cpus: int = 2) -> None:
        self.cpus, self.t, self.busy, self.own = set(range(cpus)), 0.0, 0.0, 0.0

    def advance(self, seconds: float, others: float, ours: float = 1.0) -> None:
        self.t += seconds
        self.busy += seconds * (others + ours)
        self.own += seconds * ours

    def sampler(self) -> CpuSampler:
        s = CpuSampler(cpus=self.cpus, clock=lambda: self.t, own=lambda: self.own)
        s.read = lambda: Reading(self.t, self.busy, self.own)
        return s


def test_the_watch_gives_up_a_thread_at_once_and_takes_it_back_after_two_quiet_windows():
    m = FakeMachine()
    counts, lines = [], []
    watch = ThreadWatch(2, sampler=m.sampler(), set_count=counts.append, announce=lines.append)
    m.advance(3.0, others=0.0)  # the imports, on a quiet machine
    assert watch.first() == 2 and counts == [2] and watch.others == 0.0

    def step(seconds: float, others: float) -> None:
        m.advance(seconds, others)
        assert watch.step(None, lambda: "loss") == "loss"

    step(WINDOW_S / 2, others=1.0)
    assert counts == [2]  # within the window: no reading yet
    step(WINDOW_S / 2, others=1.0)
    assert counts == [2, 1] and watch.threads == 1  # a neighbour came: down at once
    assert lines == ["threads 2 -> 1: other processes kept 1.0 of this run's 2 CPUs busy"]
    step(WINDOW_S, others=0.0)
    assert counts == [2, 1]  # one quiet window is not enough to go back up
    step(WINDOW_S, others=1.0)
    step(WINDOW_S, others=0.0)
    assert counts == [2, 1]  # the votes to go up must be consecutive
    step(WINDOW_S, others=0.0)
    assert counts == [2, 1, 2] and watch.changes == 2
    assert lines[-1] == "threads 1 -> 2: other processes kept 0.0 of this run's 2 CPUs busy"


def test_a_busy_machine_at_start_starts_on_fewer_threads():
    m = FakeMachine()
    counts = []
    watch = ThreadWatch(2, sampler=m.sampler(), set_count=counts.append, announce=None)
    m.advance(2.5, others=1.0)
    assert watch.first() == 1 and counts == [1] and watch.others == 1.0


def test_without_proc_stat_the_watch_keeps_the_automatic_choice():
    def unreadable():
        raise OSError("no /proc")

    sampler = CpuSampler(cpus={0, 1}, stat=unreadable)
    counts = []
    watch = ThreadWatch(2, sampler=sampler, set_count=counts.append, announce=None)
    assert watch.first() == 2 and counts == [2] and watch.others is None
    assert watch.step(None, lambda: 1) == 1


class Toggle(StepHook):
    """Changes the thread count before every step: 1, 2, 1, 2, ..."""

    def __init__(self) -> None:
        self.n = 0

    def step(self, batch, run):
        self.n += 1
        threads.apply(1 + self.n % 2, interop=False)
        return run()


@pytest.mark.usefixtures("long_training")
def test_training_is_bit_identical_whatever_the_thread_count_does(make_config):
    """The watch may change the count at any step: the result must not depend on it. Widths
    and batch large enough that the GEMMs and the embedding update split over threads."""
    sizes = dict(
        arch_embedding_size=(5000, 300, 40000, 7), arch_sparse_feature_size=32,
        arch_mlp_bot=(13, 256, 64, 32), arch_mlp_top=(256, 128, 1), mini_batch_size=512,
        data_size=512 * 12, test_data_size=1024, optimizer="adagrad",
    )  # fmt: skip
    before = torch.get_num_threads()
    try:
        threads.apply(1, interop=False)
        fixed = Trainer(make_config(**sizes, out_dir=make_config().out_dir + "-1"))
        fixed.fit()
        toggled = Trainer(make_config(**sizes), step_hook=StepHooks.of(Toggle(), None))
        toggled.fit()
    finally:
        threads.apply(before, interop=False)
    a, b = fixed.model.state_dict(), toggled.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_step_hooks_nest_every_hook_around_the_step_in_order():
    calls = []

    class Named(StepHook):
        def __init__(self, name):
            self.name = name

        def attach(self, trainer):
            calls.append(("attach", self.name))

        def step(self, batch, run):
            calls.append(("in", self.name))
            out = run()
            calls.append(("out", self.name))
            return out

    assert StepHooks.of(None, None) is None
    one = Named("a")
    assert StepHooks.of(None, one) is one
    both = StepHooks.of(Named("a"), Named("b"))
    both.attach("trainer")
    assert both.step("batch", lambda: calls.append("run") or 7) == 7
    with both.phase("forward"):
        pass
    assert calls == [("attach", "a"), ("attach", "b"), ("in", "a"), ("in", "b"), "run",
                     ("out", "b"), ("out", "a")]  # fmt: skip
