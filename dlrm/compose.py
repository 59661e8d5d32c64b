"""The composition root: from a configuration to the parts of a run, built once, in order.

    run = build_run(cfg, rank, world_size)   # what dlrm/trainer.py's Trainer does first

Everything that differs by placement, by process or by feature flag is decided here, so the
trainer is only the loop: the data (this rank's shard), the placement and the model, the FAE
schedule, the dense optimizer, the compiled dense step, the train pipeline it runs in (the
plain step, the staging pipeline a collection asks for, the dense part under DDP, Slipstream's
around either), the checkpoint store (single-file, sharded, none), the run directory's writer
(rank 0's, or one that writes nothing), and the pre-flight checks (paths, resume settings, free
space, the memory the placement needs: dlrm/placement/memory_check.py) before any long work. Pieces can be
injected (`data`, `model`, `step_hook`, `checkpoints=False`), so benchmarks and tools compose a
run instead of subclassing the trainer.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from dlrm import run_checks
from dlrm.build import build_model, build_placed_embeddings, resolve_device
from dlrm.checkpoints import format as ckpt
from dlrm.checkpoints import store as checkpoint_store
from dlrm.checkpoints.store import (
    CheckpointStore,
    FileCheckpoints,
    NoCheckpoints,
    ShardedCheckpoints,
)
from dlrm.config import TrainConfig
from dlrm.data import DataSplits, build_data, steps_per_epoch
from dlrm.errors import CheckpointError, ConfigError
from dlrm.pipelines import compile as compile_
from dlrm.pipelines import dense_step
from dlrm.pipelines.base import PlainTrainPipeline, StepHook, TrainPipeline
from dlrm.placement.build_collection import schedule_training_data
from dlrm.placement.run_plan import PlacedEmbeddings
from dlrm.processes import distributed, third_party, threads
from dlrm.processes.distributed import Processes
from dlrm.progress import wanted_lines as progress_lines
from dlrm.resume_files import ResumeFiles
from dlrm.run_files import NoRunFiles, RunFiles, tensorboard_writer
from dlrm.settings.sections import new_run_dir
from embeddings.staged.contract import stages
from hybrid_dlrm.common.lock import DirectoryLock, LockError, LockHeld

log = logging.getLogger(__name__)


@dataclass
class Run:
    """The built parts of a run (see the module docstring)."""

    cfg: TrainConfig
    device: torch.device
    data: DataSplits
    placement: PlacedEmbeddings | None  # None: an injected model, whose placement is its own
    model: torch.nn.Module
    dense_optimizer: torch.optim.Optimizer
    compiled: compile_.CompiledDenseForward | None  # None: eager
    pipeline: TrainPipeline
    processes: Processes
    files: RunFiles
    checkpoints: CheckpointStore
    progress: bool  # a progress bar on this process
    resume_changes: dict[str, tuple]  # the settings a resume changed (dlrm/run_checks.py)
    requested: TrainConfig  # as asked (`auto` unresolved; no --resume where nothing is saved)
    resume_files: ResumeFiles  # what its checkpoints record of the files that steer a resume
    resuming: Future | None = None  # the checkpoint to resume from, read in the background
    lines: bool = False  # progress lines on stdout (no terminal there: dlrm/progress.py)
    lock: DirectoryLock | None = (
        None  # the run directory's, held by rank 0 (hybrid_dlrm/common/lock.py)
    )
    # a line for the person running it, in the command line's style: rank 0 says it for all
    say: Callable[[str], None] = functools.partial(print, flush=True)

    def resume_target(self) -> tuple[Path, dict] | None:
        """The checkpoint to continue from with its verified contents; None: no --resume (or
        nothing saved to resume: `requested` has none)."""
        return self.resuming.result() if self.resuming is not None else None


def build_run(
    cfg: TrainConfig,
    rank: int = 0,
    world_size: int = 1,
    *,
    data: DataSplits | None = None,
    model: torch.nn.Module | None = None,
    step_hook: StepHook | None = None,
    checkpoints: bool = True,
) -> Run:
    """`data` and `model` are built from `cfg` when not given (an injected model is used as it
    is: its placement is its own, and no FAE schedule is applied to `data`). `checkpoints=False`
    writes none (benchmarks). `step_hook` watches every step (`--perf-log`'s recorder)."""
    if world_size > 1:
        distributed.check_supported(cfg, world_size)
        third_party.silence_harmless()  # torchrec's and fbgemm's known-harmless warnings
    if cfg.run.perf_log and step_hook is None:
        raise ConfigError(
            "perf_log: pass the hook that records it, Trainer(cfg, step_hook=...) "
            "(python -m dlrm.train --perf-log attaches the one a plugin registers: "
            "dlrm/pipelines/step_hooks.py)"
        )
    device = resolve_device(cfg.training.device)
    leads = rank == 0  # rank 0 writes the run directory
    say = functools.partial(print, flush=True) if leads else lambda line: None
    lock = _lock_run_dir(cfg) if leads else DirectoryLock(cfg.run_dir)  # other ranks: not held
    cfg, again = _starts_again(cfg, say)
    # The checkpoint is read and verified while the data and the model are built: reading
    # and checksumming gigabytes need not wait for table initialisation.
    store = _checkpoint_store(cfg, rank, world_size, checkpoints)
    resuming = _background(_resume_target, store, cfg, world_size) if cfg.run.resume else None
    checkpoint = resuming.result if resuming is not None else None
    resume_changes = _check_paths(cfg, checkpoint, again)
    requested = cfg
    if (
        cfg.training.threads
    ):  # 0: the process's own counts (the command line chose them: dlrm/train.py)
        threads.apply(cfg.training.threads)
    set_flush_denormal(
        cfg.training.flush_denormal
    )  # before any parallel work: see set_flush_denormal
    torch.manual_seed(cfg.training.seed)
    data = data if data is not None else build_data(cfg, rank, world_size)
    _check_learning_fits(cfg, data)
    placement: PlacedEmbeddings | None = None
    resume_files = ResumeFiles(cfg.run_dir)
    if model is None:
        from dlrm.placement.auto import resolve_auto
        from dlrm.placement.memory_check import check_memory

        # auto's choice; a close call measured on candidate runs built as this one is
        cfg, decision = resolve_auto(
            cfg, data, device, world_size, rank, checkpoint, trial_contender
        )
        if decision is not None:  # its measured step time against the predicted one
            step_hook = _checked(decision, step_hook)
        check_memory(cfg, data, device, world_size)  # before any table is allocated
        placement = build_placed_embeddings(cfg, data, device, world_size)
        model = build_model(cfg, data, device, placement.collection)
        data = schedule_training_data(cfg, data, placement, steps_per_epoch(cfg, data))
        resume_files = ResumeFiles(cfg.run_dir, cfg.placing, decision and decision.record)
    distributed.check_replicated(model.embeddings, rank)
    if checkpoints and leads and not cfg.run.inference_only:
        run_checks.check_free_space(
            cfg.run_dir, checkpoint_bytes(model), "a checkpoint of this model"
        )
    dense_optimizer = make_dense_optimizer(cfg, model.dense_parameters())
    if cfg.run.load_model:
        ckpt.load_model_file(Path(cfg.run.load_model), model)
    compiled = _compiled(cfg, model, steps_per_epoch(cfg, data) * cfg.training.nepochs, world_size)
    if compiled is not None and leads:  # else the first step sits silent for up to a minute
        # stderr, as every notice of a run in progress: a program's stdout (a benchmark's
        # JSON, a user's own output) is its own
        print("--compile: the dense step compiles on the first step (TorchInductor: up to about "
              "a minute on a cold cache, seconds from its cache)", file=sys.stderr, flush=True)  # fmt: skip
    pipeline = _pipeline(cfg, model, dense_optimizer, device, step_hook, compiled, world_size)
    if cfg.slipstreaming.enabled:
        pipeline = _slipstream(cfg, pipeline, model, placement, data, device)
    show = cfg.run.progress if cfg.run.progress is not None else sys.stderr.isatty()
    return Run(
        cfg, device, data, placement, model, dense_optimizer, compiled, pipeline,
        Processes(rank, world_size),
        RunFiles(cfg.run_dir, tensorboard_writer(cfg.run.tensorboard)) if leads
        else NoRunFiles(cfg.run_dir),
        store, bool(show) and leads, resume_changes, requested, resume_files, resuming,
        leads and progress_lines(cfg.run.progress), lock, say,
    )  # fmt: skip


def _check_learning_fits(cfg: TrainConfig, data: DataSplits) -> None:
    """`--hotline-learn-batches N` plans from the first N mini-batches' lookups and trains the
    rest with that plan: a run of N mini-batches or fewer would end with no hot row, silently."""
    n, per_epoch = cfg.hotline.learn_batches, steps_per_epoch(cfg, data)
    total = per_epoch * cfg.training.nepochs
    if n and n >= total:
        raise ConfigError(
            f"--hotline-learn-batches {n}: the run has {total} mini-batches ({cfg.training.nepochs} "
            f"epoch(s) of {per_epoch}), so no step would train with the learned plan and no row "
            f"would be hot; give fewer than {total}"
        )


def make_dense_optimizer(
    cfg: TrainConfig, params: list[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    return cfg.training.sparse_optimizer().dense_optimizer(params, cfg.training.learning_rate)


def evaluation_model(cfg: TrainConfig, model: torch.nn.Module) -> torch.nn.Module:
    """The model evaluation runs: with `--inference-only` and the reference's
    `--quantize-emb-with-bit` / `--quantize-mlp-with-bit` (issue 23) quantized, else `model`.
    Applied after the weights are loaded (`--load-model`, `--resume`)."""
    bits = (cfg.run.quantize_emb_with_bit, cfg.run.quantize_mlp_with_bit)
    if not cfg.run.inference_only or bits == (32, 32):
        return model
    from dlrm.models.quantized import quantize_for_evaluation

    return quantize_for_evaluation(model, cfg)


def inference_summary(cfg: TrainConfig) -> dict:
    """The summary's `inference` part: whether `--inference-only` evaluated a quantized model
    (`evaluation_model`); nothing for a training run."""
    if not cfg.run.inference_only:
        return {}
    bits = {"emb_bits": cfg.run.quantize_emb_with_bit, "mlp_bits": cfg.run.quantize_mlp_with_bit}
    return {"inference": {"quantized": tuple(bits.values()) != (32, 32), **bits}}


def set_flush_denormal(on: bool) -> bool:
    """Denormal floats (below 1.2e-38) read and written as zero on the CPU (x86 DAZ/FTZ), or not.
    A denormal operand costs a microcode assist per instruction, and stale denormal bit patterns
    in scratch memory made oneDNN's bf16 matmuls several times slower (docs/speed.md); values
    that small carry nothing a recommendation model needs.

    The setting is per thread and inherited by intra-op workers started after it, so a run
    applies it before any parallel work. Returns whether the CPU supports it."""
    supported = torch.set_flush_denormal(on)
    if on and not supported:
        log.debug("this CPU cannot flush denormals; they stay")
    return supported


# --- the parts ----------------------------------------------------------------------------------


def _starts_again(cfg: TrainConfig, say: Callable[[str], None]) -> tuple[TrainConfig, bool]:
    """`--resume` of a run that saved no checkpoint yet (dlrm/checkpoints/store.py's
    `nothing_to_resume`): the run as a new one, said in one line; and whether it was so."""
    if not cfg.run.resume:
        return cfg, False
    empty = checkpoint_store.nothing_to_resume(cfg.run.resume, cfg.run_dir)
    if empty is None:
        return cfg, False
    if cfg.run.inference_only:
        raise CheckpointError(f"--resume: no checkpoint in {empty} to evaluate")
    say(f"no checkpoint in {empty} yet: starting from the beginning")
    return cfg.replace(resume=None), True


def _check_paths(cfg: TrainConfig, checkpoint, again: bool) -> dict[str, tuple]:
    """The run's paths and `--resume`'s settings, before any long work; the settings a resume
    changes (the checkpoint's own settings are checked again when it is loaded). `checkpoint`:
    the one being read, asked only where config.json and this run disagree. `again`: a run
    started again from nothing saved (said already)."""
    changes: dict[str, tuple] = {}  # the paths rank 0 writes were checked as it took the lock
    if cfg.run.resume:
        run_checks.check_resume_target(cfg)
        source = run_checks.resume_source_dir(cfg)
        before = run_checks.read_run_settings(source) if source is not None else None
        if before is not None:
            changes = run_checks.check_settings_early(before, cfg, source, checkpoint)
    elif not again:
        run_checks.check_run_dir_is_free(cfg)
    return changes


def _lock_run_dir(cfg: TrainConfig) -> DirectoryLock:
    """One process at a time writes a run directory: a second run started on it would mix its
    files with the first's (issue 37). Rank 0 holds it for the run (the other ranks write no
    run files, so they take no lock and wait for nothing)."""
    run_checks.check_write_paths(cfg)  # before the lock makes the directory
    chosen = getattr(cfg.run, "out_dir_chosen", False) and not cfg.run.resume
    for _ in range(100):
        try:
            lock = DirectoryLock(cfg.run_dir).acquire("--out-dir")
        except LockHeld as e:
            # the default name (the second it started) taken by a run started in the same
            # second: the next free name, as a run started a second later would have had
            if not (e.alive and chosen):
                raise ConfigError(str(e)) from None
            cfg.run.out_dir = new_run_dir()
            continue
        except LockError as e:
            raise ConfigError(str(e)) from None
        if chosen and run_checks.holds_a_run(cfg.run_dir):  # that run has ended already
            lock.release()
            cfg.run.out_dir = new_run_dir()
            continue
        return lock
    raise ConfigError(f"--out-dir: {cfg.run_dir}: no free run directory after 100 tries")


def _background(fn, *args) -> Future:
    """`fn(*args)` on a thread of its own; its result (or exception) from `.result()`."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="resume")
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def _resume_target(store: CheckpointStore, cfg: TrainConfig, world_size: int):
    """`--resume`'s checkpoint, checked against this run's number of processes."""
    path, data = store.resume_target(cfg.run.resume, cfg.run_dir)
    return path, distributed.resumable_with(cfg, path, data, world_size)


def checkpoint_bytes(model: torch.nn.Module) -> int:
    """About what one checkpoint takes: every table with its optimizer state, and the dense
    parameters with their optimizer's (at most twice more)."""
    dense = sum(p.numel() for p in model.dense_parameters()) * 3
    return model.embeddings.checkpoint_bytes() + 4 * dense


def _checkpoint_store(
    cfg: TrainConfig, rank: int, world_size: int, checkpoints: bool
) -> CheckpointStore:
    directory = cfg.run_dir / "checkpoints"
    if not checkpoints:
        return NoCheckpoints(directory)
    if world_size > 1:  # every rank writes its shards (dlrm/checkpoints/sharded.py)
        return ShardedCheckpoints(
            directory, cfg.run.keep_checkpoints, rank, world_size, cfg.training.optimizer
        )
    if rank != 0:
        # Rank 0 writes the whole run: every rank's collection is a replica of the others'
        # (distributed.check_replicated), so no rank holds rows rank 0 lacks.
        return NoCheckpoints(directory)
    return FileCheckpoints(directory, cfg.run.keep_checkpoints)


def _compiled(
    cfg: TrainConfig, model: torch.nn.Module, steps: int, world_size: int
) -> compile_.CompiledDenseForward | None:
    """`--compile` (dlrm/pipelines/compile.py); off while the performance model records its trace, whose
    kernel models are of the eager step's operators."""
    written = dense_step.supports(model)
    if not compile_.wanted(
        cfg.training.compile, cfg.training.precision, cfg.training.mini_batch_size, steps, written
    ):
        return None
    if world_size > 1:  # auto: eager (an explicit --compile was refused at the start)
        return None
    if cfg.run.perf_log:
        log.warning("--compile: off with --perf-log (the performance model traces eager steps)")
        return None
    return compile_.compile_dense_part(model, cfg.training.precision, cfg.training.loss_function)


def _checked(decision, hook: StepHook | None) -> StepHook:
    from dlrm.placement.auto_check import MeasuredAgainstPredicted

    return MeasuredAgainstPredicted(decision.chosen.label(), decision.checked_ms(), hook)


def trial_contender(cfg: TrainConfig, data: DataSplits, device: torch.device):
    """A candidate's run for the placement trial (dlrm/placement/trials.py), built as `build_run`
    builds one (placed embeddings, model, the placement's training data, dense optimizer, train
    pipeline) but eager and single-process: a compile would cost the trial's budget many times
    over."""
    from dlrm.placement.trials import Stepping

    placement = build_placed_embeddings(cfg, data, device)
    model = build_model(cfg, data, device, placement.collection)
    train = schedule_training_data(cfg, data, placement, steps_per_epoch(cfg, data)).train
    dense = make_dense_optimizer(cfg, model.dense_parameters())
    pipeline = _pipeline(cfg, model, dense, device, None, None, 1)
    return Stepping(pipeline, train, device, [placement, model])


def _pipeline(
    cfg: TrainConfig,
    model: torch.nn.Module,
    dense_optimizer: torch.optim.Optimizer,
    device: torch.device,
    hook: StepHook | None,
    compiled: compile_.CompiledDenseForward | None,
    world_size: int,
) -> TrainPipeline:
    """The plain step, or the variant the embedding collection needs (Hotline's staging); the
    compiled dense step, if any, runs inside it."""
    args = (
        model,
        dense_optimizer,
        device,
        cfg.training.precision,
        cfg.training.loss_function,
        hook,
    )
    if stages(model.embeddings):  # cold rows staged per mini-batch, ahead of the step
        from dlrm.pipelines.staging import HotlineTrainPipeline
        from dlrm.placement.run_plan import learned_plan

        return HotlineTrainPipeline(
            *args,
            prefetch=cfg.hotline.prefetch,
            learn_batches=cfg.hotline.learn_batches,
            make_plan=lambda coll: learned_plan(cfg.placing, cfg.run_dir, coll),
            written=compiled,
        )
    if world_size > 1:  # the dense part under DDP (dlrm/processes/distributed.py)
        return PlainTrainPipeline(*args, forward=distributed.data_parallel(model), written=compiled)
    return PlainTrainPipeline(*args, written=compiled)


def _slipstream(
    cfg: TrainConfig,
    inner: TrainPipeline,
    model: torch.nn.Module,
    placement: PlacedEmbeddings | None,
    data: DataSplits,
    device: torch.device,
) -> TrainPipeline:
    """`--slipstream`: the placement's pipeline wrapped in Slipstream's."""
    from dlrm.pipelines.slipstream import SlipstreamTrainPipeline
    from dlrm.placement.run_plan import profiled_batches, tracked_plan
    from embeddings.staleness import StalenessTracker

    plan = tracked_plan(cfg, placement, data.train)
    s = cfg.slipstreaming
    tracker = StalenessTracker(plan, s.metric, s.threshold, s.target_skip, s.min_lookups)
    profiled = frozenset(profiled_batches(len(data.train), cfg.placing.profile_sample_rate))
    return SlipstreamTrainPipeline(inner, model, tracker, s, cfg.training.mini_batch_size,
                                   steps_per_epoch(cfg, data), device, seed=cfg.training.seed,
                                   learning_rate=cfg.training.learning_rate, profiled=profiled)  # fmt: skip
