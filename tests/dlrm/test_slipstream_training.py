"""Slipstream through the trainer: exact when nothing is stale, skipping only what is stale,
freezing stale rows, and resumable bit for bit."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from dlrm import Trainer
from dlrm.pipelines.base import StepHook
from dlrm.pipelines.slipstream import SlipstreamTrainPipeline
from dlrm.train import main

from .test_hotline_training import HOTLINE, assert_same_model

SLIP = dict(slipstream=True, slipstream_interval=6, slipstream_warmup=8, hot_budget="1KB",
            profile_sample_rate=0.2, device="cpu", test_data_size=256)  # fmt: skip


class Watch(StepHook):
    """Checks every trained mini-batch against the stale set it was chosen under."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.stale_inputs_trained = 0
        self.frozen_rows_changed = 0
        self.frozen_checked = 0

    def attach(self, trainer) -> None:
        self.pipe: SlipstreamTrainPipeline = trainer.pipeline

    def step(self, batch, run):
        pipe, tr = self.pipe, self.pipe.tracker
        inputs = batch.labels.numel()
        self.sizes.append(inputs)
        if not pipe._active:
            return run()
        if pipe.freeze:
            ids = (torch.from_numpy(tr.tables), torch.from_numpy(tr.rows))
            before = pipe.coll.rows_of(*ids)[0]
            loss = run()
            after = pipe.coll.rows_of(*ids)[0]
            self.frozen_checked += int(tr.stale.sum())
            self.frozen_rows_changed += int((before != after).any(1)[tr.stale].sum())
            return loss
        self.stale_inputs_trained += int(
            tr.stale_inputs(tr.lookups(batch.sparse_features, inputs)).sum()
        )
        return run()


@pytest.mark.parametrize(
    "mode,placement",
    [("drop", "device"), ("freeze", "device"), ("drop", "hotline"), ("drop", "fae")],
)
@pytest.mark.usefixtures("long_training")
def test_with_nothing_stale_slipstream_trains_exactly_like_the_baseline(
    make_config, tmp_path, mode, placement
):
    common = dict(data_size=64 * 24, optimizer="adagrad", test_freq=15, test_data_size=256)
    fae = dict(placement="fae", hot_budget="1KB", profile_sample_rate=0.2, fae_switch_period=4)
    base = Trainer(make_config(**common, **(fae if placement == "fae" else {}),
                               out_dir=str(tmp_path / "base"), device="cpu"))  # fmt: skip
    slip = {**SLIP, **(dict(HOTLINE, hotline_prefetch=2) if placement == "hotline" else {}),
            **(fae if placement == "fae" else {})}  # fmt: skip
    slip = Trainer(make_config(**{**slip, **common}, slipstream_mode=mode, slipstream_threshold=0.0,
                               out_dir=str(tmp_path / "slip")))  # fmt: skip
    a, b = base.fit(), slip.fit()
    assert_same_model(slip, base, 0.0)
    assert a["test_auc"] == b["test_auc"] and a["steps"] == b["steps"] == 24
    s = b["slipstream"]
    assert s["samples_skipped"] == s["emb_lookups_saved"] == 0 and s["snapshots"] == 1 + 24 // 6
    assert s["stale_row_share"] == 0.0 and s["tracked_rows"] > 0


@pytest.mark.parametrize(
    "mode,placement", [("drop", "device"), ("freeze", "device"), ("freeze", "hotline")]
)
@pytest.mark.usefixtures("long_training")
def test_only_stale_inputs_are_dropped_and_frozen_rows_stay_put(
    make_config, tmp_path, mode, placement
):
    watch = Watch()
    where = dict(HOTLINE, hot_budget="1KB") if placement == "hotline" else {}
    cfg = make_config(**{**SLIP, **where}, data_size=64 * 30, nepochs=2, slipstream_mode=mode,
                      slipstream_target_skip=0.3, out_dir=str(tmp_path / mode))  # fmt: skip
    summary = Trainer(cfg, step_hook=watch).fit()
    s = summary["slipstream"]
    assert summary["epochs_completed"] == 2 and watch.stale_inputs_trained == 0
    assert (
        s["samples_trained"] + s["samples_skipped"]
        == 2 * 64 * 30
        == summary["samples"] + s["samples_skipped"]
    )
    assert 0 < s["stale_row_share"] <= 1 and s["snapshots"] >= 2
    if mode == "drop":  # full steps; the epoch ends early; the last step of each may be short
        assert 0.05 < s["skipped_input_share"] < 0.6 and summary["steps"] < 60
        assert watch.sizes.count(64) >= len(watch.sizes) - 2
        assert s["emb_lookups_saved"] == s["lookups_dropped"] == 4 * s["samples_skipped"]
    else:  # every input trained; the stale rows got no update while frozen
        assert summary["steps"] == 60 and s["samples_skipped"] == 0 and s["lookups_frozen"] > 0
        assert watch.frozen_checked > 0 and watch.frozen_rows_changed == 0
    events = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if e["event"] == "train"]
    assert train[-1]["stale_row_share"] == s["stale_row_share"] or summary["steps"] % 10
    assert all("skipped_input_share" in e for e in train)
    assert all("train_time_s" in e for e in events if e["event"] == "eval")


@pytest.mark.parametrize(
    "extra",
    [
        dict(slipstream_mode="drop"),
        dict(slipstream_mode="freeze", optimizer="rowwise_adagrad"),
        dict(slipstream_control="random", slipstream_normalize=True),
        dict(slipstream_mode="drop", slipstream_control="staleness", **HOTLINE, hotline_prefetch=2),
    ],
    ids=["drop", "freeze", "random-normalized", "hotline"],
)
@pytest.mark.usefixtures("long_training")
def test_resume_reproduces_the_uninterrupted_run_exactly(make_config, tmp_path, extra):
    # checkpoints every 7 steps, snapshots every 6: resumed between snapshots and right after
    common = {**SLIP, "slipstream_target_skip": 0.3, "test_freq": 7, "nepochs": 2,
              "data_size": 64 * 20, **extra}  # fmt: skip
    full = Trainer(make_config(**common, keep_checkpoints=20, out_dir=str(tmp_path / "full")))
    want = full.fit()
    assert want["slipstream"]["samples_skipped"] > 0 or extra.get("slipstream_mode") == "freeze"
    # from the end of the first epoch (drop ends it early) and from inside the second
    events = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    evals = [e["step"] for e in map(json.loads, events) if e["event"] == "eval"]
    first_end = min(
        e["step"] for e in map(json.loads, events) if e["event"] == "eval" and e["epoch"] == 1
    )
    ckpt_dir = tmp_path / "full" / "checkpoints"
    later = next(s for s in evals if s > first_end + 1)
    for step in (first_end, later) if extra.get("slipstream_mode") == "drop" else (later,):
        ckpt = ckpt_dir / f"step_{step:09d}.pt"
        cut = tmp_path / f"cut{ckpt.stem}"
        (cut / "checkpoints").mkdir(parents=True)
        shutil.copy(ckpt, cut / "checkpoints")
        resumed = Trainer(make_config(**common, out_dir=str(cut), resume="auto"))
        got = resumed.fit()
        assert_same_model(full, resumed, 0.0)
        for key in [
            "test_auc",
            "test_logloss",
            "steps",
            "samples",
            "epochs_completed",
            "slipstream",
        ]:
            assert want[key] == got[key], (ckpt.name, key)


# --- over the tiered SCM placement ------------------------------------------------------------


class Crash(Exception):
    """Stands for kill -9 before a step: nothing after it runs (files are left as they are)."""


class CrashAt(Watch):
    """Watch that crashes the run when it is about to train step `at` (0-based)."""

    def __init__(self, at: int | None = None) -> None:
        super().__init__()
        self.at = at

    def attach(self, trainer) -> None:
        super().attach(trainer)
        self.trainer = trainer

    def step(self, batch, run):
        if self.trainer.state.step == self.at:
            raise Crash
        return super().step(batch, run)


def _logged(run_dir: Path) -> list[tuple]:
    """metrics.jsonl's evaluations and Slipstream's counters in its train events."""
    events = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    keep = ("test_auc", "samples_skipped", "stale_row_share", "snapshots", "lookups_frozen")
    return [(e["event"], e["step"], e["epoch"], *(e.get(k) for k in keep)) for e in events
            if e["event"] in ("eval", "train")]  # fmt: skip


@pytest.mark.parametrize("mode", ["drop", "freeze"])
@pytest.mark.usefixtures("long_training")
def test_tiered_skips_and_resumes_after_crashes_exactly(make_config, tmp_path, mode):
    # The tier's rows live in an SSD file a crash leaves as it is (later writes than the
    # checkpoint included), so a resume is tested as the tier's own tests do it: crash, resume
    # in the same directory. Crashed after the end of the first epoch (drop ends it early) and
    # between snapshots inside the second; checkpoints every 7 steps, snapshots every 6.
    from .test_tiered_training import TIERED, same_tables

    common = {**SLIP, **TIERED, "optimizer": "adagrad", "slipstream_mode": mode,
              "slipstream_target_skip": 0.3, "test_freq": 7, "nepochs": 2,
              "data_size": 64 * 20}  # fmt: skip
    watch = CrashAt()
    full = Trainer(make_config(**common, out_dir=str(tmp_path / "full")), step_hook=watch)
    want = full.fit()
    s = want["slipstream"]
    assert want["placement"]["kind"] == "tiered" and want["placement"]["scm_rows_read"] > 0
    assert s["snapshots"] >= 2 and 0 < s["stale_row_share"] <= 1
    if mode == "drop":
        assert s["samples_skipped"] > 0 and watch.stale_inputs_trained == 0
        assert want["steps"] < 40
    else:
        assert s["lookups_frozen"] > 0 and want["steps"] == 40
        assert watch.frozen_checked > 0 and watch.frozen_rows_changed == 0
    logged = _logged(tmp_path / "full")
    evals = [(step, epoch) for event, step, epoch, *_ in logged if event == "eval"]
    first_end = next(step for step, epoch in evals if epoch == 1)
    later = next(step for step, _ in evals if step > first_end + 1)
    run = tmp_path / "run"
    # one step trained (and written to the tier) after the checkpoint at first_end, two after
    # the one at later; then the crash
    for resume, at in (("", first_end + 1), ("auto", later + 2)):
        cfg = make_config(**common, out_dir=str(run), resume=resume or None)
        with pytest.raises(Crash):
            Trainer(cfg, step_hook=CrashAt(at)).fit()
    resumed = Trainer(make_config(**common, out_dir=str(run), resume="auto"))
    got = resumed.fit()
    same_tables(full, resumed)
    for key in ["test_auc", "test_logloss", "steps", "samples", "epochs_completed", "slipstream"]:
        assert want[key] == got[key], key
    assert _logged(run) == logged


def test_normalized_features_are_unit_vectors_in_evaluation(make_config, tmp_path):
    t = Trainer(make_config(**SLIP, slipstream_normalize=True, out_dir=str(tmp_path / "n")))
    t.model.eval()
    batch = next(t.data.test.batches(0))
    pooled = t.model.embeddings(batch.sparse_features).values().view(64, 4, 4)
    torch.testing.assert_close(pooled.norm(dim=2), torch.ones(64, 4))


@pytest.mark.usefixtures("long_training")
def test_tbsm_drops_whole_histories(make_config, tmp_path):
    from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior

    raw = tmp_path / "ub.csv"
    write_user_behavior(raw, PlantedBehavior(num_users=200, min_events=8, max_events=12, seed=2))
    cfg = make_config(
        model="tbsm", data_set="taobao", raw_data_file=str(raw), ts_length=4, mini_batch_size=32,
        arch_embedding_size=None, arch_sparse_feature_size=None, arch_mlp_bot=None,
        arch_mlp_top=None, **{**SLIP, "hot_budget": "64KB", "slipstream_interval": 4,
                              "slipstream_warmup": 4}, slipstream_target_skip=0.3,
        slipstream_min_lookups=1,  # a tiny data set: few lookups per row and interval
    )  # fmt: skip
    watch = Watch()
    summary = Trainer(cfg, step_hook=watch).fit()
    s = summary["slipstream"]
    assert s["samples_skipped"] > 0 and watch.stale_inputs_trained == 0
    assert watch.sizes.count(32) >= len(watch.sizes) - 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--slipstream", "--slipstream-mode", "skip"], "--slipstream-mode: expected one of drop, freeze"),
        (["--slipstream", "--slipstream-target-skip", "1.5"], "--slipstream-target-skip: expected a number in [0, 1)"),
        (["--slipstream", "--slipstream-interval", "0"], "--slipstream-interval: expected a positive integer"),
        (["--slipstream", "--slipstream-threshold", "-1"], "--slipstream-threshold: expected a finite number >= 0"),
        (["--slipstream", "--slipstream-min-lookups", "-1"], "--slipstream-min-lookups: expected an integer >= 0"),
        (["--slipstream-normalize"], "--slipstream-normalize: only with --slipstream"),
        (["--slipstream", "--slipstream-control", "random", "--slipstream-target-skip", "0"], "drops --slipstream-target-skip"),
        (["--slipstream", "--placement", "hotline", "--hotline-learn-batches", "4"], "--slipstream: tracks the plan's hot rows"),
    ],
)  # fmt: skip
def test_bad_slipstream_flags_get_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main(argv + ["--out-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["drop", "freeze"])
def test_slipstream_on_cuda_skips_and_resumes_exactly(make_config, tmp_path, mode):
    """On CUDA: nothing stale trains like the baseline (1e-5: the kernels' summation order);
    with skipping, a run resumed inside an epoch (snapshots moved to the device) ends where the
    uninterrupted one does. Not yet run: no GPU was lent to this work."""
    common = dict(data_size=64 * 20, optimizer="adagrad", device="cuda", test_data_size=256)
    base = Trainer(make_config(**common, out_dir=str(tmp_path / "base")))
    exact = Trainer(make_config(**{**SLIP, **common}, slipstream_mode=mode,
                                slipstream_threshold=0.0, out_dir=str(tmp_path / "exact")))  # fmt: skip
    base.fit(), exact.fit()
    assert_same_model(exact, base, 1e-5)
    skip = {**SLIP, **common, "slipstream_mode": mode, "slipstream_target_skip": 0.3,
            "test_freq": 7, "nepochs": 2}  # fmt: skip
    full = Trainer(make_config(**skip, keep_checkpoints=20, out_dir=str(tmp_path / "full")))
    want = full.fit()
    assert want["slipstream"]["emb_lookups_saved"] > 0
    cut = tmp_path / "cut"
    (cut / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "full" / "checkpoints" / "step_000000014.pt", cut / "checkpoints")
    got = Trainer(make_config(**skip, out_dir=str(cut), resume="auto")).fit()
    # CUDA's atomics make drifts differ in the last bits, so a decision at a threshold's edge
    # may flip: the resumed run ends within a step of the uninterrupted one
    assert want["epochs_completed"] == got["epochs_completed"] == 2
    assert abs(want["steps"] - got["steps"]) <= 1
    a, b = want["slipstream"]["samples_skipped"], got["slipstream"]["samples_skipped"]
    assert abs(a - b) <= 0.02 * max(a, 64)


def test_a_kill_after_the_final_checkpoint_or_a_finished_run_trains_no_more(
    make_config, tmp_path, capsys
):
    # Issue 37, 4: drop ends the epoch early, so the run ends with fewer steps than the epoch's
    # batches; a resume from the final checkpoint took that for "not done" and trained a step.
    common = {**SLIP, "slipstream_mode": "drop", "slipstream_target_skip": 0.3, "test_freq": 7,
              "data_size": 64 * 20}  # fmt: skip
    full = Trainer(make_config(**common, out_dir=str(tmp_path / "full")))
    want = full.fit()
    assert want["steps"] < 20 and want["slipstream"]["samples_skipped"] > 0
    final = tmp_path / "full" / "checkpoints" / f"step_{want['steps']:09d}.pt"
    # killed right after the final checkpoint: no summary yet; the resume only finishes the run
    cut = tmp_path / "cut"
    (cut / "checkpoints").mkdir(parents=True)
    shutil.copy(final, cut / "checkpoints")
    resumed = Trainer(make_config(**common, out_dir=str(cut), resume="auto"))
    got = resumed.fit()
    assert_same_model(full, resumed, 0.0)
    for key in ["test_auc", "test_logloss", "steps", "samples", "epochs_completed", "slipstream"]:
        assert want[key] == got[key], key
    # resuming the finished run: nothing trained, nothing written, and it says so
    run = tmp_path / "full"
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    again = Trainer(make_config(**common, out_dir=str(run), resume="auto"))
    capsys.readouterr()
    assert again.fit() == json.loads((run / "summary.json").read_text())
    said = capsys.readouterr().out.splitlines()
    assert f"run already finished at step {want['steps']}; nothing to do" in said
    assert_same_model(full, again, 0.0)
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before
