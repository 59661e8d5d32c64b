"""The training loop, evaluation and checkpoint/resume, usable without the CLI.

    from dlrm import Trainer, TrainConfig
    summary = Trainer(TrainConfig(num_batches=100, out_dir="runs/demo")).fit()

The trainer is the loop. What it runs is built first, in one place (dlrm/compose.py's
`build_run`: data, placement, model, dense optimizer, the train pipeline with the compiled step
inside it, the checkpoint store, the run directory's writer); the step itself is a train pipeline
(dlrm/pipelines/base.py). Around the step the trainer does the learning-rate policy, logging,
evaluation, the checkpoint cadence and the summary. Pieces can be injected (`data`, `model`,
`step_hook`, `checkpoints=False`), so benchmarks and tools compose a trainer instead of
subclassing it. Everything that decides the numbers (seed, data position, RNG state, optimizer
states, the LR policy's step) is in the checkpoint, so a resumed run on CPU ends with exactly the
weights and metrics of an uninterrupted one.

The trainer takes `rank`/`world_size` so a process group can be added without restructuring; it
never tests them: data sources shard each batch, metrics are reduced through `Processes`
(dlrm/processes/distributed.py), and what only rank 0 writes goes through objects that write nothing on
the other ranks (dlrm/run_files.py, dlrm/checkpoints/store.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dlrm import compose, run_checks, run_files
from dlrm.checkpoints import format as ckpt
from dlrm.checkpoints.store import CheckpointState, NoCheckpoints
from dlrm.compose import set_flush_denormal  # noqa: F401  (its home before dlrm/compose.py)
from dlrm.config import TrainConfig
from dlrm.data import DataSplits, steps_per_epoch
from dlrm.errors import CheckpointError, NonFiniteLoss, TrainingDiverged
from dlrm.evaluation import evaluate
from dlrm.lr_schedule import learning_rate_at
from dlrm.pipelines.base import StepHook
from dlrm.placement.build_collection import logged_counters, placement_summary
from dlrm.progress import Progress
from dlrm.run_checks import check_resume_settings
from embeddings.room import fmt_bytes

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where the run is; everything here goes into the checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    samples: int = 0
    train_time_s: float = 0.0
    loss_sum: float = 0.0
    loss_count: int = 0
    last_eval: dict = field(default_factory=dict)
    stop_reason: str = ""
    time_breakdown_s: dict = field(default_factory=dict)  # across resumes, as train_time_s
    # after each process's first WARMUP_STEPS (compile, first-touch allocations): the
    # steady-state rate's samples and seconds, across resumes
    steady_samples: int = 0
    steady_time_s: float = 0.0
    steady_data_s: float = 0.0  # of steady_time_s: waiting for batches

    def to_checkpoint(self) -> dict:
        """Every field (plain values and a dict of floats: what a weights-only load accepts)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_checkpoint(cls, value: dict) -> TrainState:
        if isinstance(value.get("last_eval"), str):  # older checkpoints kept it as JSON text
            value = dict(value, last_eval=json.loads(value["last_eval"]))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise CheckpointError(f"train state: unknown fields {', '.join(unknown)}")
        return cls(**value)


# steps of each process left out of the steady-state rate: the first compiles the dense step
# (seconds to a minute), the next ones still allocate and fill caches
WARMUP_STEPS = 3
# a checkpoint this large takes seconds to write (Kaggle's tables, 2.2 GB: 14 s on a shared
# 2-core VM): its start and end are said, so the run does not sit silent in between
SAID_CHECKPOINT_BYTES = 1 << 30


class _Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        rank: int = 0,
        world_size: int = 1,
        *,
        data: DataSplits | None = None,
        model: torch.nn.Module | None = None,
        step_hook: StepHook | None = None,
        checkpoints: bool = True,
    ) -> None:
        """`data` and `model` are built from `cfg` when not given (an injected model is used as it
        is: its placement is its own, and no FAE schedule is applied to `data`). `checkpoints=False`
        writes none (benchmarks). `step_hook` watches every step (perfmodel's recorder)."""
        run = compose.build_run(cfg, rank, world_size, data=data, model=model,
                                step_hook=step_hook, checkpoints=checkpoints)  # fmt: skip
        # as asked (checkpoints record `--placement auto`, not its choice)
        self.cfg, self.rank, self.world_size = run.requested, rank, world_size
        cfg = run.requested
        self.device, self.data, self.placement = run.device, run.data, run.placement
        self.model, self.dense_optimizer = run.model, run.dense_optimizer
        self.pipeline, self.compiled = run.pipeline, run.compiled  # compiled None: eager
        self.processes, self.files, self.checkpoints = run.processes, run.files, run.checkpoints
        self.run_dir, self.ckpt_dir = cfg.run_dir, run.checkpoints.directory
        self._progress, self._lines, self._say = run.progress, run.lines, run.say
        self._resume_changes = run.resume_changes
        self._resume_files = run.resume_files
        self._lock = (
            run.lock
        )  # the run directory's, held since build_run (hybrid_dlrm/common/lock.py)
        self.state = TrainState()
        self.finished_summary: dict | None = None  # fit() found the run finished: its summary
        self.timer = _Timer()
        self._lr = cfg.training.learning_rate
        self._warm_left, self._steady_since = WARMUP_STEPS, None  # this process's warm-up
        self._reported = (0, 0.0)  # samples and training seconds at the last progress line
        self.pipeline.hook.attach(self)
        found = run.resume_target()
        if found:  # None: no --resume, or nothing was saved (the run starts again: compose.py)
            self.load_checkpoint(*found)
        self.model = compose.evaluation_model(cfg, self.model)

    # --- run directory ------------------------------------------------------------------------

    def _open_run_dir(self) -> None:
        self.files.open(self.cfg, self._resume_changes)
        resumed_from = self._last_checkpoint()
        if self.cfg.run.resume and resumed_from is not None:
            dropped = self.files.drop_events_after(self.state.step)
            changed = {k: {"before": a, "now": b} for k, (a, b) in self._resume_changes.items()}
            self._event(
                "resume", checkpoint=str(resumed_from), dropped_events=dropped,
                changed_settings=changed,
            )  # fmt: skip

    def _event(self, event: str, **fields) -> None:
        st = self.state
        self.files.event({"event": event, "step": st.step, "epoch": st.epoch, **fields})

    # --- the loop -----------------------------------------------------------------------------

    def _set_learning_rate(self) -> None:
        c = self.cfg
        lr = learning_rate_at(
            self.state.step,
            c.training.learning_rate,
            c.training.lr_num_warmup_steps,
            c.training.lr_decay_start_step,
            c.training.lr_num_decay_steps,
        )
        if lr != self._lr:
            for group in self.dense_optimizer.param_groups:
                group["lr"] = lr
            self.model.embeddings.set_learning_rate(lr)
            self._lr = lr

    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.cfg, self.data)

    def fit(self) -> dict:
        """Train to the configured end (or the AUC threshold), evaluate, write the summary. The
        run directory is free for another process afterwards, however this ends."""
        try:
            return self._fit()
        finally:
            self._lock.release()

    def _fit(self) -> dict:
        if self.cfg.run.inference_only:
            return self.evaluate_only()
        cfg, st = self.cfg, self.state
        per_epoch = self.steps_per_epoch()
        total = per_epoch * cfg.training.nepochs
        # resumed at its end (a pipeline that skips inputs, Slipstream's, ends an epoch in fewer
        # steps than it has batches: the epoch count says so, the step count does not)
        stop = st.stop_reason != "" or st.step >= total or st.epoch >= cfg.training.nepochs
        if stop and self._finished_before():
            return self.finished_summary
        self._open_run_dir()
        talk = Progress(total, st.step, cfg.training.nepochs, bar=self._progress,
                        lines=sys.stdout if self._lines else None)  # fmt: skip
        self._reported = (st.samples, st.train_time_s)
        batches, clock = None, time.perf_counter()
        while not stop:
            if batches is None:
                batches = self.data.train.batches(st.epoch, start=st.batch_in_epoch)
            self._set_learning_rate()
            out = self._step(batches)
            if out is not None:
                self._record(out)
                talk.step()
                if cfg.run.print_freq and st.step % cfg.run.print_freq == 0:
                    clock = self._lap(clock)
                    self._log_train(talk)
            epoch_done = out is None or st.batch_in_epoch >= per_epoch
            if epoch_done:
                st.epoch, st.batch_in_epoch, batches = st.epoch + 1, 0, None
            if epoch_done or (cfg.run.test_freq and st.step % cfg.run.test_freq == 0):
                clock = self._lap(clock)
                stop = self._evaluate_and_checkpoint()
                clock = time.perf_counter()  # evaluation and checkpoints are not training time
            stop = stop or st.epoch >= cfg.training.nepochs
        self._lap(clock)
        talk.close()
        if not st.stop_reason:
            st.stop_reason = "completed"
        if cfg.run.save_model:
            self.save_model_file(Path(cfg.run.save_model))
        return self._write_summary()

    def _finished_before(self) -> bool:
        """A resumed run that had already finished (its summary written at this step): nothing
        is trained or written; `finished_summary` is that summary. A run killed after its final
        checkpoint has none yet: it only finishes (summary, model file)."""
        done = run_files.read_summary(self.run_dir, self.state.step)
        # every rank decides alike (a collective): rank 0 may write the summary of a run it
        # finishes before another rank has looked
        if self.processes.mean(torch.tensor(float(done is not None))) < 1.0:
            return False
        if self.cfg.run.save_model and not Path(self.cfg.run.save_model).exists():
            self.save_model_file(Path(self.cfg.run.save_model))
        self._say(f"run already finished at step {self.state.step}; nothing to do")
        self.finished_summary = done
        return True

    def _step(self, batches):
        """The pipeline's step; None when it found nothing left to train in this epoch (a
        pipeline that skips inputs, Slipstream's, can end an epoch early)."""
        try:
            return self.pipeline.progress(batches)
        except StopIteration:
            return None
        except NonFiniteLoss as e:
            st = self.state
            raise TrainingDiverged(
                f"{e} at step {st.step} (epoch {st.epoch}, batch {st.batch_in_epoch}); "
                f"last good checkpoint: {self._last_checkpoint() or 'none'}; {self._calmer()}"
            ) from None

    def _calmer(self) -> str:
        """What usually trains where a run diverged (e.g. sum-pooled multi-hot bags under the
        one-hot recipe's SGD rate): a lower rate, or an optimizer with per-row steps."""
        return (f"a lower --learning-rate than {self.cfg.training.learning_rate:g}, or --optimizer "
                "adagrad, may train")  # fmt: skip

    def _record(self, out) -> None:
        st = self.state
        self.timer.add("data_s", out.data_s)
        self.timer.add("compute_s", out.compute_s)
        if out.kind:  # e.g. FAE's hot and cold steps, timed apart
            self.timer.add(f"{out.kind}_s", out.compute_s)
        st.step += 1
        st.batch_in_epoch += out.source_batches
        st.samples += self.processes.global_samples(out.samples)
        st.loss_sum += self.processes.mean(out.loss)
        st.loss_count += 1
        if self._steady_since is not None:
            st.steady_samples += self.processes.global_samples(out.samples)
            st.steady_data_s += out.data_s
        elif self._warm_left > 1:
            self._warm_left -= 1
        else:  # the warm-up's last step: the steady state starts now
            self._warm_left, self._steady_since = 0, time.perf_counter()

    def _lap(self, since: float) -> float:
        now = time.perf_counter()
        self.state.train_time_s += now - since
        if self._steady_since is not None:
            self.state.steady_time_s += now - max(since, self._steady_since)
        return now

    def _log_train(self, talk: Progress) -> None:
        st = self.state
        mean_loss = st.loss_sum / max(st.loss_count, 1)
        samples0, time0 = self._reported
        since_samples, since_s = st.samples - samples0, st.train_time_s - time0
        rate = since_samples / since_s if since_s > 0 else 0.0  # the steps since the last line
        self._event("train", loss=mean_loss, lr=self._lr, samples=st.samples, samples_per_s=rate,
                    **logged_counters(self.model.embeddings, self.timer.totals),
                    **self.pipeline.counters())  # fmt: skip
        talk.report(st.step, st.epoch, mean_loss, since_samples, since_s)
        log.info("step %d: loss %.5f, %.0f samples/s", st.step, mean_loss, rate)
        st.loss_sum, st.loss_count = 0.0, 0
        self._reported = (st.samples, st.train_time_s)

    def _evaluate_and_checkpoint(self) -> bool:
        """Evaluate, checkpoint, and say whether the AUC threshold was reached."""
        metrics = self.evaluate()
        self.state.last_eval = metrics
        self._event("eval", train_time_s=self.state.train_time_s,
                    **{f"test_{k}": v for k, v in metrics.items()})  # fmt: skip
        reached = (
            bool(self.cfg.run.mlperf_auc_threshold)
            and metrics["auc"] >= self.cfg.run.mlperf_auc_threshold
        )
        if reached:
            self.state.stop_reason = "auc_threshold"
        self.save_checkpoint()
        return reached

    def evaluate(self) -> dict:
        t0 = time.perf_counter()
        metrics = evaluate(self.model, self.data.test, self.device, self.cfg.training.precision,
                           self._progress, self._say)  # fmt: skip
        self.timer.add("eval_s", time.perf_counter() - t0)
        return metrics

    def evaluate_only(self) -> dict:
        self._open_run_dir()
        self.state.last_eval = self.evaluate()
        self._event("eval", **{f"test_{k}": v for k, v in self.state.last_eval.items()})
        self.state.stop_reason = "inference_only"
        return self._write_summary()

    def _write_summary(self) -> dict:
        """summary.json: the flat keys of before (what scripts and tests read) and, per
        capability, a group that capability reports itself (the collection's placement and
        store parts, the pipeline's, the compiled step's time)."""
        st, c = self.state, self.cfg
        ev = st.last_eval or {}
        overall = st.samples / st.train_time_s if st.train_time_s > 0 else 0.0
        steady = st.steady_samples / st.steady_time_s if st.steady_time_s > 0 else None
        times = {k: round(v, 6) for k, v in self.timer.totals.items()}
        compile_s = self.compiled.compile_s if self.compiled is not None else 0.0
        summary = {
            "test_auc": ev.get("auc"),
            "test_logloss": ev.get("logloss"),
            "test_accuracy": ev.get("accuracy"),
            "test_ne": ev.get("ne"),
            "test_samples": ev.get("samples"),
            # the steady state where the run had one (the compile and the first steps of each
            # process left out); a run too short for one: over the whole run
            "train_samples_per_s": steady if steady is not None else overall,
            "steps": st.step,
            "epochs_completed": st.epoch,
            "samples": st.samples,
            "wall_s": st.train_time_s,
            "stop_reason": st.stop_reason,
            "time_breakdown_s": times,
            "device": str(self.device),
            "precision": c.training.precision,
            "compiled": self.compiled is not None and not self.compiled.fell_back,
            "placement": placement_summary(self.model.embeddings, self.device, c.placing.placement),
            "throughput": {
                "steady_samples_per_s": steady,
                "overall_samples_per_s": overall,
                "warmup_steps_per_process": WARMUP_STEPS,
                "steady_samples": st.steady_samples,
                "steady_data_s": round(st.steady_data_s, 6),
            },
            "time": {
                "train_s": round(st.train_time_s, 6),
                "steady_s": round(st.steady_time_s, 6),
                "compile_s": round(compile_s, 6),
                **times,
            },
        }
        summary.update(self.model.embeddings.summary_parts())  # e.g. its SSD tier's
        summary.update(self.pipeline.summary_parts())  # e.g. Slipstream's
        summary.update(compose.inference_summary(c))
        self.files.summary(summary)
        return summary

    # --- checkpoints --------------------------------------------------------------------------

    def _last_checkpoint(self) -> Path | None:
        return self.checkpoints.last_good

    def _checkpoint(self) -> CheckpointState:
        """What a checkpoint holds: put together here only, whatever store writes it."""
        self.model.embeddings.begin_checkpoint()  # every tier current; a file tier marks a point
        self.state.time_breakdown_s = dict(self.timer.totals)
        return CheckpointState(
            arch=self.cfg.arch_signature(), config=self.cfg.to_json(), model=self.model,
            dense_optimizer=self.dense_optimizer, pipeline=self.pipeline,
            train_state=self.state.to_checkpoint(), step=self.state.step,
            resume_files=self._resume_files.record(),
        )  # fmt: skip

    def checkpoint_state(self) -> dict:
        """A single-process checkpoint's contents."""
        return self._checkpoint().whole()

    def save_checkpoint(self) -> Path | None:
        t0 = time.perf_counter()
        size = (
            0
            if isinstance(self.checkpoints, NoCheckpoints)
            else compose.checkpoint_bytes(self.model)
        )
        if size >= SAID_CHECKPOINT_BYTES:  # seconds of writing: said, not a silent pause
            self._say(f"step {self.state.step}: writing a checkpoint of about {fmt_bytes(size)}")
        path = self.checkpoints.save(self._checkpoint)  # None: this store writes none
        if path is not None:
            self._event("checkpoint", path=str(path))
            self.timer.add("checkpoint_s", time.perf_counter() - t0)
            if size >= SAID_CHECKPOINT_BYTES:
                self._say(f"step {self.state.step}: checkpoint written in "
                          f"{time.perf_counter() - t0:.1f} s ({path})")  # fmt: skip
        return path

    def load_checkpoint(self, path: Path, data: dict | None = None) -> None:
        """Continue from the checkpoint at `path` (`data`: its contents, already verified)."""
        data = self.checkpoints.load(path) if data is None else data
        if ckpt.is_model_file(data):
            raise CheckpointError(
                f"{path}: a model file (weights only, as --save-model writes), not a checkpoint: it "
                "has no optimizer state or position to resume from; start from it with --load-model"
            )
        if data.get("arch") != self.cfg.arch_signature():
            raise CheckpointError(
                f"{path}: written for a different model or optimizer ({data.get('arch')})"
            )
        if "config" in data:  # older checkpoints: config.json was checked, if there was one
            self._check_settings_file(data)
            self._resume_changes = check_resume_settings(data["config"], self.cfg, str(path))
        self._resume_files.check(data)  # the profile and plan it was built from
        ckpt.load_model_state(self.model, data["model"], path)
        emb = self.model.embeddings
        # before version 2 of the trainer's layout the transfer counters stood at the top level
        extra = data.get("embedding_extra", {k: data[k] for k in ("placement_stats",) if k in data})
        try:
            emb.load_sparse_state_dict(data["sparse_optimizer"])
            emb.load_extra_state(extra)
            self.dense_optimizer.load_state_dict(data["dense_optimizer"])
            self.pipeline.load_state_dict(data.get("pipeline", {}))
        except (KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: optimizer state does not fit ({e})") from None
        try:
            self.state = TrainState.from_checkpoint(data["train_state"])
        except CheckpointError as e:  # it knows the field, not the file
            raise CheckpointError(f"{path}: {e}") from None
        self.timer.totals = dict(self.state.time_breakdown_s)
        ckpt.set_rng_state(data["rng"])
        self._lr = float("nan")  # force the LR of the next step to be applied
        self.checkpoints.resumed_from(path)
        st, epochs = self.state, self.cfg.training.nepochs
        where = (
            f"epoch {st.epoch + 1} of {epochs}, batch {st.batch_in_epoch}"
            if st.batch_in_epoch
            else f"{st.epoch} of {epochs} epochs done"
        )
        self._say(f"resumed from {path} at step {st.step} ({where})")

    def _check_settings_file(self, data: dict) -> None:
        """The run directory's config.json holds the checkpoint's settings (or this run's)."""
        source = run_checks.resume_source_dir(self.cfg) if self.cfg.run.resume else None
        settings = run_checks.read_run_settings(source, warn=False) if source else None
        if settings is not None:
            step = int(data["train_state"]["step"])
            run_checks.check_settings_file(
                settings, data["config"], self.cfg, source / "config.json", step
            )

    def save_model_file(self, path: Path) -> None:
        """Weights only (no optimizer), for --load-model and inference."""
        state = self.model.state_dict()  # with sharded tables: a collective, on every rank
        self.files.model_file(path, self.model, self.cfg.arch_signature(), state)
