"""Which thread does the SSD tier's work (issue #47 part 2): the training step's thread only hands
its updated rows over; the tier's reads, admissions, evictions and the renewal of stagings read
before a write-back run on the staging worker, and training stays bit-identical to the device
placement. And the per-thread CPU counter the benchmark reports with."""

import threading
import time

import pytest

from dlrm import Trainer
from embeddings.ssd.tier import ScmTier
from embeddings.staged.collection import StagedEmbeddingBagCollection
from hybrid_dlrm.common.thread_cpu import ThreadCpu, name_os_thread, sample

from .test_tiered_training import DEVICE, TIERED, same_tables

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

STEPS = 16  # after the first, each staging reads, evicts and writes dirty rows (2 KB cache)


def _record(monkeypatch, calls: list) -> None:
    """Every call of the tier's storing and reading methods and of the collection's renewal of
    a staging, with the thread it ran on (and the rows a renewal read again)."""
    renew = StagedEmbeddingBagCollection._renew_from_store

    def renewing(self, staged, *a):
        before = staged.renewed
        renew(self, staged, *a)
        calls.append(("renewed", threading.current_thread() is threading.main_thread()))
        calls.append((f"renewed rows {staged.renewed - before > 0}", None))

    monkeypatch.setattr(StagedEmbeddingBagCollection, "_renew_from_store", renewing)
    load_renew = StagedEmbeddingBagCollection._renew

    def loading(self, staged, prev):
        found = staged.overlap is not None and prev is not None and staged.overlap[0] is prev[0]
        calls.append((f"overlap found by the worker {found}", None))
        return load_renew(self, staged, prev)

    monkeypatch.setattr(StagedEmbeddingBagCollection, "_renew", loading)
    for name in ("read_rows", "_store", "_write_file", "_read_file", "write_rows"):
        original = getattr(ScmTier, name)

        def wrapped(self, *a, _original=original, _name=name, **kw):
            calls.append((_name, threading.current_thread() is threading.main_thread()))
            return _original(self, *a, **kw)

        monkeypatch.setattr(ScmTier, name, wrapped)


def test_the_step_thread_only_hands_rows_over_and_trains_like_the_device(
    make_config, tmp_path, monkeypatch
):
    common = dict(data_size=64 * STEPS, optimizer="adagrad", learning_rate=0.1)
    device = Trainer(make_config(**common, **DEVICE, out_dir=str(tmp_path / "device")))
    tiered = Trainer(make_config(**common, **TIERED, out_dir=str(tmp_path / "tiered")))
    calls: list[tuple[str, bool]] = []
    _record(monkeypatch, calls)
    coll = tiered.model.embeddings
    streams = [t.data.train.batches(0, 0) for t in (device, tiered)]
    tiered.pipeline.progress(streams[1])  # the first staging runs on the step's path
    device.pipeline.progress(streams[0])
    calls.clear()
    for _ in range(STEPS - 2):
        device.pipeline.progress(streams[0])
        tiered.pipeline.progress(streams[1])
    tiered.pipeline.settle()
    on_step = sorted({name for name, main in calls if main})
    assert on_step == ["write_rows"]  # the hand-over, nothing else of the tier's
    on_worker = {name for name, main in calls if main is False}
    assert {"read_rows", "_store", "_write_file", "_read_file", "renewed"} <= on_worker
    # stagings read before the write-back before their step were renewed (on the worker)
    assert ("renewed rows True", None) in calls
    # and the staged rows the step before updated were found by the worker, copied by the step
    assert ("overlap found by the worker True", None) in calls
    c = coll.counters()
    assert c["scm_cache_evictions"] > 0 and c["scm_rows_read"] > 0  # the file was really used
    same_tables(device, tiered)


def test_the_thread_counter_sees_a_named_thread_burn_cpu():
    """Counted, not timed: the thread is found by its name, its CPU is monotone and non-zero."""
    stop = threading.Event()
    ready = threading.Event()

    def burn():
        name_os_thread("burner")
        ready.set()
        x = 0
        while not stop.is_set():
            x += sum(range(1000))

    t = threading.Thread(target=burn, name="burner")
    counter = ThreadCpu().start()
    t.start()
    ready.wait()
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = sample().get(t.native_id)
        if now is not None:
            seen.append(now.cpu_s)
        if len(seen) >= 2 and seen[-1] > 0:
            break
        time.sleep(0.05)
    with open(f"/proc/self/task/{t.native_id}/comm") as f:
        comm = f.read().strip()
    spent = counter.stop()
    stop.set()
    t.join()
    assert comm == "burner"  # its kernel name too (`top -H`; native pools are named by it)
    assert seen == sorted(seen) and seen[-1] > 0
    # both counted in clock ticks; differences of float sums (0.06 - 0.0 against the process's
    # 0.05999999999999517) may land a hair apart
    assert spent["burner"] > 0 and spent["process"] >= spent["burner"] - 1e-9
    assert "step" in spent  # the main thread, counted apart


def test_a_staging_renewed_before_the_worker_reached_it_completes_and_trains_like_the_device(
    make_config, tmp_path
):
    """The worker has not reached a staging yet when the step asks for its renewal (two
    mini-batches staged ahead, the worker held inside the staging before it): the staging
    completes the future it was submitted with, the renewal runs after it, nothing waits
    forever, and the run is bit-identical to the device placement."""
    common = dict(data_size=64 * 8, optimizer="adagrad", learning_rate=0.1)
    device = Trainer(make_config(**common, **DEVICE, out_dir=str(tmp_path / "device")))
    tiered = Trainer(
        make_config(**common, **TIERED, hotline_prefetch=2, out_dir=str(tmp_path / "tiered"))
    )
    coll = tiered.model.embeddings
    asked, stagings, renewals = threading.Event(), [], []
    stage, renewal = coll.stage, coll.renewal

    def held_stage(*a, **kw):  # the third staging (batch 2) waits for two renewals (of 2 and 3)
        stagings.append(1)
        if len(stagings) == 3:
            asked.wait(timeout=60)  # a guard against hanging, not a timing
        return stage(*a, **kw)

    def asking(since):
        out = renewal(since)
        renewals.append(out is not None)
        if len(renewals) == 2:
            asked.set()
        return out

    coll.stage, coll.renewal = held_stage, asking
    streams = [t.data.train.batches(0, 0) for t in (device, tiered)]

    def train():
        for _ in range(6):
            tiered.pipeline.progress(streams[1])
        tiered.pipeline.settle()

    t = threading.Thread(target=train, daemon=True)
    t.start()
    for _ in range(6):
        device.pipeline.progress(streams[0])
    t.join(timeout=300)
    assert not t.is_alive(), "the staging pipeline waits forever"
    assert renewals[:2] == [True, True] and len(stagings) >= 6
    same_tables(device, tiered)
