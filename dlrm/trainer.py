"""The training loop, evaluation and checkpoint/resume, usable without the CLI.

    from dlrm import Trainer, TrainConfig
    summary = Trainer(TrainConfig(num_batches=100, out_dir="runs/demo")).fit()

The step itself is a train pipeline (dlrm/train_pipeline.py); the trainer runs it in one loop and
does what is around it: the learning-rate policy, logging, evaluation, checkpoints. Pieces can be
injected (`data`, `model`, `step_hook`, `checkpoints=False`), so benchmarks and tools compose a
trainer instead of subclassing it. Everything that decides the numbers (seed, data position, RNG
state, optimizer states, the LR policy's step) is in the checkpoint, so a resumed run on CPU ends
with exactly the weights and metrics of an uninterrupted one.

The trainer takes `rank`/`world_size` so a process group can be added without restructuring:
data sources shard each batch, metrics gather across ranks (uneven shards included), and a
collection that would drift apart across processes is refused (see `_check_processes`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from dlrm import checkpoint as ckpt
from dlrm import compile as compile_
from dlrm import dense_step, distributed, run_checks, sharded_checkpoint
from dlrm.build import build_model, build_placed_embeddings, resolve_device
from dlrm.config import TrainConfig
from dlrm.data import DataSplits, build_data
from dlrm.embedding_setup import (
    PlacedEmbeddings,
    logged_counters,
    placement_summary,
    schedule_training_data,
)
from dlrm.errors import CheckpointError, ConfigError, NonFiniteLoss, TrainingDiverged
from dlrm.evaluation import evaluate
from dlrm.lr_schedule import learning_rate_at
from dlrm.train_pipeline import PlainTrainPipeline, StepHook, TrainPipeline

log = logging.getLogger(__name__)


def _background(fn, *args) -> Future:
    """`fn(*args)` on a thread of its own; its result (or exception) from `.result()`."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="resume")
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def make_dense_optimizer(
    cfg: TrainConfig, params: list[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    # fused: one kernel for every parameter instead of a Python loop over them
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate, fused=True)
    # adagrad and rowwise_adagrad: the dense part uses plain Adagrad, as the reference does
    return torch.optim.Adagrad(params, lr=cfg.learning_rate, eps=1e-8, fused=True)


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


class _Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds


def set_flush_denormal(on: bool) -> bool:
    """Denormal floats (below 1.2e-38) read and written as zero on the CPU (x86 DAZ/FTZ), or not.
    A denormal operand costs a microcode assist per instruction, and stale denormal bit patterns
    in scratch memory made oneDNN's bf16 matmuls several times slower (docs/speed.md); values
    that small carry nothing a recommendation model needs.

    The setting is per thread and inherited by intra-op workers started after it, so the trainer
    applies it before any parallel work. Returns whether the CPU supports it."""
    supported = torch.set_flush_denormal(on)
    if on and not supported:
        log.debug("this CPU cannot flush denormals; they stay")
    return supported


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
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        if world_size > 1:
            distributed.check_supported(cfg, world_size)
        if cfg.perf_log and step_hook is None:
            raise ConfigError(
                "perf_log: attach perfmodel's recorder as the step hook, "
                "Trainer(cfg, step_hook=perfmodel.recorder.StepRecorder(cfg.perf_log)) "
                "(python -m dlrm.train --perf-log does)"
            )
        self.device = resolve_device(cfg.device)
        self._resume_changes: dict[str, tuple] = {}
        if rank == 0:
            run_checks.check_write_paths(cfg)
        if cfg.resume:
            run_checks.check_resume_target(cfg)
            source = run_checks.resume_source_dir(cfg)
            before = run_checks.read_run_settings(source) if source is not None else None
            if before is not None:
                # early, before any long work; the checkpoint's own settings are checked on load
                self._resume_changes = run_checks.check_resume_settings(before, cfg, str(source))
        run_checks.check_run_dir_is_free(cfg)
        # The checkpoint is read and verified while the data and the model are built: reading
        # and checksumming gigabytes need not wait for table initialisation.
        resuming = _background(ckpt.resume_target, cfg.resume, cfg.run_dir) if cfg.resume else None
        set_flush_denormal(cfg.flush_denormal)  # before any parallel work: see set_flush_denormal
        torch.manual_seed(cfg.seed)
        self.data = data if data is not None else build_data(cfg, rank, world_size)
        self.placement: PlacedEmbeddings | None = None
        if model is None:
            self.placement = build_placed_embeddings(cfg, self.data, self.device, world_size)
            model = build_model(cfg, self.data, self.device, self.placement.collection)
            self.data = schedule_training_data(
                cfg, self.data, self.placement, self.steps_per_epoch()
            )
        self.model = model
        _check_processes(self.model.embeddings, rank)
        if checkpoints and rank == 0 and not cfg.inference_only:
            run_checks.check_free_space(
                cfg.run_dir, self._checkpoint_bytes(), "a checkpoint of this model"
            )
        self.dense_optimizer = make_dense_optimizer(cfg, self.model.dense_parameters())
        self.pipeline = self._make_pipeline(step_hook)
        if cfg.slipstream:
            self.pipeline = self._slipstream(self.pipeline)
        self.write_checkpoints = checkpoints
        self.state = TrainState()
        self.timer = _Timer()
        self.run_dir = cfg.run_dir
        self.ckpt_dir = self.run_dir / "checkpoints"
        self._lr = cfg.learning_rate
        show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
        self._progress = bool(show) and rank == 0
        self.pipeline.hook.attach(self)
        if cfg.load_model:
            ckpt.load_model_file(Path(cfg.load_model), self.model)
        self.compiled = self._compile_dense_part()  # None: eager
        self._good_checkpoint: Path | None = None  # the newest this process wrote or verified
        if resuming is not None:
            found = resuming.result()
            if found:  # None: the run stopped before its first checkpoint; it starts again
                self.load_checkpoint(*found)
        bits = (cfg.quantize_emb_with_bit, cfg.quantize_mlp_with_bit)
        if cfg.inference_only and bits != (32, 32):  # the reference's flags (issue 23)
            from dlrm.quantized_model import quantize_for_evaluation

            self.model = quantize_for_evaluation(self.model, cfg)

    def _compile_dense_part(self) -> compile_.CompiledDenseForward | None:
        """`--compile` (dlrm/compile.py); off while the performance model records its trace, whose
        kernel models are of the eager step's operators."""
        cfg = self.cfg
        steps = self.steps_per_epoch() * cfg.nepochs
        written = dense_step.supports(self.model)
        if not compile_.wanted(cfg.compile, cfg.precision, cfg.mini_batch_size, steps, written):
            return None
        if self.world_size > 1:  # auto: eager (an explicit --compile was refused at the start)
            return None
        if self.cfg.perf_log:
            log.warning("--compile: off with --perf-log (the performance model traces eager steps)")
            return None
        compiled = compile_.compile_dense_part(
            self.model, self.cfg.precision, self.cfg.loss_function
        )
        step = getattr(self.pipeline, "inner", self.pipeline)  # Slipstream's wraps the plain one
        if compiled is not None and isinstance(step, PlainTrainPipeline):
            step.written = compiled
        return compiled

    def _make_pipeline(self, hook: StepHook | None) -> TrainPipeline:
        """The plain step, or the variant the embedding collection needs (Hotline's split)."""
        cfg = self.cfg
        args = (
            self.model,
            self.dense_optimizer,
            self.device,
            cfg.precision,
            cfg.loss_function,
            hook,
        )
        from embeddings.staging import stages

        if stages(self.model.embeddings):
            from dlrm.embedding_setup import learned_plan
            from dlrm.hotline_pipeline import HotlineTrainPipeline

            return HotlineTrainPipeline(
                *args,
                prefetch=cfg.hotline_prefetch,
                learn_batches=cfg.hotline_learn_batches,
                make_plan=lambda coll: learned_plan(cfg, coll),
            )
        if self.world_size > 1:  # the dense part under DDP (dlrm/distributed.py)
            return PlainTrainPipeline(*args, forward=distributed.data_parallel(self.model))
        return PlainTrainPipeline(*args)

    def _slipstream(self, inner: TrainPipeline) -> TrainPipeline:
        """`--slipstream`: the placement's pipeline wrapped in Slipstream's."""
        from dlrm.embedding_setup import profiled_batches, tracked_plan
        from dlrm.slipstream_pipeline import SlipstreamSettings, SlipstreamTrainPipeline
        from embeddings.staleness import StalenessTracker

        cfg = self.cfg
        plan = tracked_plan(cfg, self.placement, self.data.train)
        tracker = StalenessTracker(plan, cfg.slipstream_metric, cfg.slipstream_threshold,
                                   cfg.slipstream_target_skip, cfg.slipstream_min_lookups)  # fmt: skip
        settings = SlipstreamSettings(
            cfg.slipstream_mode, cfg.slipstream_interval, cfg.slipstream_metric,
            cfg.slipstream_threshold, cfg.slipstream_target_skip, cfg.slipstream_warmup,
            cfg.slipstream_control, cfg.slipstream_normalize, cfg.seed, cfg.learning_rate,
            frozenset(profiled_batches(len(self.data.train), cfg.profile_sample_rate)),
        )  # fmt: skip
        return SlipstreamTrainPipeline(inner, self.model, tracker, settings, cfg.mini_batch_size,
                                       self.steps_per_epoch(), self.device)  # fmt: skip

    # --- run directory ------------------------------------------------------------------------

    def _open_run_dir(self) -> None:
        if self.rank != 0:  # rank 0 writes the run directory
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.run_dir / "config.json"
        kept = self.cfg.resume and run_checks.read_run_settings(self.run_dir, warn=False)
        if not kept or self._resume_changes:
            config_path.write_text(json.dumps(self.cfg.to_json(), indent=2) + "\n")
        if self.cfg.resume and self._good_checkpoint is not None:
            dropped = self._drop_superseded_events()
            changed = {k: {"before": a, "now": b} for k, (a, b) in self._resume_changes.items()}
            self._event(
                "resume", checkpoint=str(self._good_checkpoint), dropped_events=dropped,
                changed_settings=changed,
            )  # fmt: skip

    def _drop_superseded_events(self) -> int:
        """metrics.jsonl reads as one run: the events a killed run logged after the checkpoint
        this run resumes from are dropped (they are computed again); returns how many."""
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return 0
        lines = path.read_text().splitlines()
        keep, step = [], self.state.step
        for line in lines:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if e.get("step", 0) <= step:
                keep.append(line)
        if len(keep) != len(lines):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(x + "\n" for x in keep))
            tmp.replace(path)
        return len(lines) - len(keep)

    def _event(self, event: str, **fields) -> None:
        if self.rank != 0:
            return
        record = {"event": event, "step": self.state.step, "epoch": self.state.epoch, **fields}
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # --- the loop -----------------------------------------------------------------------------

    def _set_learning_rate(self) -> None:
        c = self.cfg
        lr = learning_rate_at(
            self.state.step,
            c.learning_rate,
            c.lr_num_warmup_steps,
            c.lr_decay_start_step,
            c.lr_num_decay_steps,
        )
        if lr != self._lr:
            for group in self.dense_optimizer.param_groups:
                group["lr"] = lr
            self.model.embeddings.set_learning_rate(lr)
            self._lr = lr

    def steps_per_epoch(self) -> int:
        n = len(self.data.train)
        return min(n, self.cfg.num_batches) if self.cfg.num_batches else n

    def fit(self) -> dict:
        """Train to the configured end (or the AUC threshold), evaluate, write the summary."""
        if self.cfg.inference_only:
            return self.evaluate_only()
        self._open_run_dir()
        cfg, st = self.cfg, self.state
        per_epoch = self.steps_per_epoch()
        total = per_epoch * cfg.nepochs
        bar = tqdm(
            total=total, initial=st.step, disable=not self._progress, desc="train", unit="batch"
        )
        stop = st.stop_reason != "" or st.step >= total
        batches, clock = None, time.perf_counter()
        while not stop:
            if batches is None:
                batches = self.data.train.batches(st.epoch, start=st.batch_in_epoch)
            self._set_learning_rate()
            out = self._step(batches)
            if out is not None:
                self._record(out)
                bar.update(1)
                if cfg.print_freq and st.step % cfg.print_freq == 0:
                    clock = self._lap(clock)
                    self._log_train(bar)
            epoch_done = out is None or st.batch_in_epoch >= per_epoch
            if epoch_done:
                st.epoch, st.batch_in_epoch, batches = st.epoch + 1, 0, None
            if epoch_done or (cfg.test_freq and st.step % cfg.test_freq == 0):
                clock = self._lap(clock)
                stop = self._evaluate_and_checkpoint()
                clock = time.perf_counter()  # evaluation and checkpoints are not training time
            stop = stop or st.epoch >= cfg.nepochs
        self._lap(clock)
        bar.close()
        if not st.stop_reason:
            st.stop_reason = "completed"
        if cfg.save_model:
            self.save_model_file(Path(cfg.save_model))
        return self._write_summary()

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
                f"last good checkpoint: {self._last_checkpoint() or 'none'}"
            ) from None

    def _record(self, out) -> None:
        st = self.state
        self.timer.add("data_s", out.data_s)
        self.timer.add("compute_s", out.compute_s)
        if out.kind:  # e.g. FAE's hot and cold steps, timed apart
            self.timer.add(f"{out.kind}_s", out.compute_s)
        st.step += 1
        st.batch_in_epoch += out.source_batches
        # global steps: every rank trains an equal slice of the global batch (dlrm/distributed.py)
        st.samples += out.samples * self.world_size
        st.loss_sum += distributed.mean_across_ranks(out.loss)
        st.loss_count += 1

    def _lap(self, since: float) -> float:
        now = time.perf_counter()
        self.state.train_time_s += now - since
        return now

    def _log_train(self, bar) -> None:
        st = self.state
        mean_loss = st.loss_sum / max(st.loss_count, 1)
        rate = st.samples / st.train_time_s if st.train_time_s > 0 else 0.0
        self._event("train", loss=mean_loss, lr=self._lr, samples=st.samples, samples_per_s=rate,
                    **logged_counters(self.model.embeddings, self.timer.totals),
                    **self.pipeline.counters())  # fmt: skip
        bar.set_postfix(loss=f"{mean_loss:.4f}")
        log.info("step %d: loss %.5f, %.0f samples/s", st.step, mean_loss, rate)
        st.loss_sum, st.loss_count = 0.0, 0

    def _evaluate_and_checkpoint(self) -> bool:
        """Evaluate, checkpoint, and say whether the AUC threshold was reached."""
        metrics = self.evaluate()
        self.state.last_eval = metrics
        self._event("eval", train_time_s=self.state.train_time_s,
                    **{f"test_{k}": v for k, v in metrics.items()})  # fmt: skip
        reached = (
            bool(self.cfg.mlperf_auc_threshold) and metrics["auc"] >= self.cfg.mlperf_auc_threshold
        )
        if reached:
            self.state.stop_reason = "auc_threshold"
        self.save_checkpoint()
        return reached

    def evaluate(self) -> dict:
        t0 = time.perf_counter()
        metrics = evaluate(
            self.model, self.data.test, self.device, self.cfg.precision, self._progress
        )
        self.timer.add("eval_s", time.perf_counter() - t0)
        return metrics

    def evaluate_only(self) -> dict:
        self._open_run_dir()
        self.state.last_eval = self.evaluate()
        self._event("eval", **{f"test_{k}": v for k, v in self.state.last_eval.items()})
        self.state.stop_reason = "inference_only"
        return self._write_summary()

    def _write_summary(self) -> dict:
        st = self.state
        ev = st.last_eval or {}
        summary = {
            "test_auc": ev.get("auc"),
            "test_logloss": ev.get("logloss"),
            "test_accuracy": ev.get("accuracy"),
            "test_ne": ev.get("ne"),
            "test_samples": ev.get("samples"),
            "train_samples_per_s": st.samples / st.train_time_s if st.train_time_s > 0 else 0.0,
            "steps": st.step,
            "epochs_completed": st.epoch,
            "samples": st.samples,
            "wall_s": st.train_time_s,
            "stop_reason": st.stop_reason,
            "time_breakdown_s": {k: round(v, 6) for k, v in self.timer.totals.items()},
            "device": str(self.device),
            "precision": self.cfg.precision,
            "compiled": self.compiled is not None and not self.compiled.fell_back,
            "placement": placement_summary(self.model.embeddings, self.device),
        }
        if self.pipeline.counters():
            summary["slipstream"] = self.pipeline.counters()
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    # --- checkpoints --------------------------------------------------------------------------

    def _last_checkpoint(self) -> Path | None:
        # Not merely the newest file: a resume may have skipped corrupt newer ones.
        return self._good_checkpoint

    def checkpoint_state(self) -> dict:
        emb = self.model.embeddings
        emb.begin_checkpoint()  # every tier current; a file tier marks a consistent point
        self.state.time_breakdown_s = dict(self.timer.totals)
        return {
            "format": ckpt.FORMAT,
            "version": ckpt.VERSION,
            "arch": self.cfg.arch_signature(),
            "config": self.cfg.to_json(),  # what a resume must match (dlrm/run_checks.py)
            "model": self.model.state_dict(),
            "sparse_optimizer": emb.sparse_state_dict(),
            "embedding_extra": emb.extra_state(),
            "dense_optimizer": self.dense_optimizer.state_dict(),
            "pipeline": self.pipeline.state_dict(),
            "train_state": self.state.to_checkpoint(),
            "rng": ckpt.rng_state(),
        }

    def save_checkpoint(self) -> Path | None:
        if not self.write_checkpoints:
            return None
        if self.world_size > 1:  # every rank writes its shards (dlrm/sharded_checkpoint.py)
            t0 = time.perf_counter()
            path = sharded_checkpoint.save(self)
            if self.rank == 0:
                self._event("checkpoint", path=str(path))
            self._good_checkpoint = path
            self.timer.add("checkpoint_s", time.perf_counter() - t0)
            return path
        if self.rank != 0:
            # Rank 0 writes the whole run: every rank's collection is a replica of the others'
            # (`_check_processes`), so no rank holds rows rank 0 lacks.
            return None
        t0 = time.perf_counter()
        path = ckpt.checkpoint_path(self.ckpt_dir, self.state.step)
        written = False
        try:
            ckpt.save(self.checkpoint_state(), path)
            written = True
        finally:
            self.model.embeddings.end_checkpoint(written)
        self._good_checkpoint = path
        ckpt.prune(self.ckpt_dir, self.cfg.keep_checkpoints)
        self._event("checkpoint", path=str(path))
        self.timer.add("checkpoint_s", time.perf_counter() - t0)
        return path

    def load_checkpoint(self, path: Path, data: dict | None = None) -> None:
        """Continue from the checkpoint at `path` (`data`: its contents, already verified)."""
        data = ckpt.load(path) if data is None else data
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
            self._resume_changes = run_checks.check_resume_settings(
                data["config"], self.cfg, str(path)
            )
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
        self._good_checkpoint = path
        log.info("resumed from %s at step %d", path, self.state.step)

    def _checkpoint_bytes(self) -> int:
        """About what one checkpoint takes: every table with its optimizer state, and the dense
        parameters with their optimizer's (at most twice more)."""
        dense = sum(p.numel() for p in self.model.dense_parameters()) * 3
        return self.model.embeddings.checkpoint_bytes() + 4 * dense

    def save_model_file(self, path: Path) -> None:
        """Weights only (no optimizer), for --load-model and inference."""
        state = self.model.state_dict()  # with sharded tables: a collective, on every rank
        if self.rank == 0:
            ckpt.save_model_file(path, self.model, self.cfg.arch_signature(), state)


def _check_processes(embeddings, rank: int) -> None:
    """With a process group of several ranks, every rank runs its own copy of the collection:
    refuse collections whose copies would drift apart (each rank updating its rows with its own
    gradients), and so also never lose a rank's rows by checkpointing on rank 0 only."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    if not embeddings.replicated_across_ranks():
        raise ConfigError(
            f"rank {rank}: this embedding placement keeps an independent copy of the tables in every "
            "process, which would drift apart; multi-process training needs sharded tables"
        )
