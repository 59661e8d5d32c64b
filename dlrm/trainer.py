"""The training loop, evaluation and checkpoint/resume, usable without the CLI.

    from dlrm import Trainer, TrainConfig
    summary = Trainer(TrainConfig(num_batches=100, out_dir="runs/demo")).fit()

Per step: the dense part runs under bf16 autocast when asked (embeddings stay fp32), the loss is
BCE with logits, backward applies the sparse updates inside the embedding collection, then the
dense optimizer steps. Everything that decides the numbers (seed, data position, RNG state,
optimizer states, the LR policy's step) is in the checkpoint, so a resumed run on CPU ends with
exactly the weights and metrics of an uninterrupted one.

The trainer takes `rank`/`world_size` so a process group can be added without restructuring:
data sources shard each batch, metrics gather across ranks.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dlrm import checkpoint as ckpt
from dlrm import placement
from dlrm.config import ConfigError, TrainConfig
from dlrm.data import DataSplits, build_data
from dlrm.errors import CheckpointError, TrainingDiverged
from dlrm.lr_schedule import learning_rate_at
from dlrm.metrics import binary_metrics
from dlrm.models.dlrm import DLRM, DLRMArch
from dlrm.models.tbsm import TBSM, TBSMArch
from embeddings import tables_for_features

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    return torch.device(name)


def _check_run_dir_is_free(cfg: TrainConfig) -> None:
    """A new run never writes into an earlier run's directory: its metrics and checkpoints
    would be mixed with (or pruned among) the old ones."""
    run = cfg.run_dir
    if cfg.resume or not run.is_dir():
        return
    if (run / "metrics.jsonl").exists() or ckpt.list_checkpoints(run / "checkpoints"):
        raise ConfigError(
            f"--out-dir: {run} already holds a run; pass --resume to continue it or choose another --out-dir"
        )


def build_model(cfg: TrainConfig, data: DataSplits, device: torch.device) -> DLRM | TBSM:
    sizes = list(data.table_sizes)
    if cfg.arch_embedding_size is not None:
        given = list(cfg.arch_embedding_size)
        if len(given) != len(sizes):
            raise ConfigError(
                f"--arch-embedding-size: {len(given)} tables given, the data set has {len(sizes)} sparse features"
            )
        small = [i for i, (g, n) in enumerate(zip(given, sizes)) if g < n]
        if small:
            i = small[0]
            raise ConfigError(
                f"--arch-embedding-size: table {i} has {given[i]} rows but the data set's ids need {sizes[i]}"
            )
        sizes = given
    if cfg.model == "tbsm":
        return _build_tbsm(cfg, data, sizes, device)
    try:
        arch = DLRMArch(
            num_dense=data.num_dense,
            embedding_dim=cfg.arch_sparse_feature_size,
            num_sparse=len(sizes),
            bottom=cfg.arch_mlp_bot,
            top=cfg.arch_mlp_top,
            interaction=cfg.arch_interaction_op,
            interaction_itself=cfg.arch_interaction_itself,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return DLRM(arch, _embedding_collection(cfg, sizes, data, device), seed=cfg.seed).to(device)


def _embedding_collection(
    cfg: TrainConfig, sizes: list[int], data: DataSplits, device: torch.device
) -> torch.nn.Module:
    tables = tables_for_features(sizes, cfg.arch_sparse_feature_size, data.feature_names)
    return placement.build_embeddings(cfg, tables, data.train, device)  # --placement


def _build_tbsm(cfg: TrainConfig, data: DataSplits, sizes: list[int], device: torch.device) -> TBSM:
    """TBSM (--model tbsm): the same embedding collection under a per-step DLRM and a TSL."""
    try:
        arch = TBSMArch(
            num_dense=data.num_dense,
            embedding_dim=cfg.arch_sparse_feature_size,
            num_sparse=len(sizes),
            bottom=cfg.arch_mlp_bot,
            top=cfg.arch_mlp_top,
            ts_length=cfg.ts_length,
            model_type=cfg.model_type,
            tsl_inner=cfg.tsl_inner,
            tsl_mechanism=cfg.tsl_mechanism,
            tsl_num_heads=cfg.tsl_num_heads,
            tsl_mlp=cfg.tsl_mlp,
            arch_mlp=cfg.arch_mlp,
            tsl_proj=cfg.tsl_proj,
            mha_num_heads=cfg.mha_num_heads,
            rnn_num_layers=cfg.rnn_num_layers,
            interaction=cfg.arch_interaction_op,
            interaction_itself=cfg.arch_interaction_itself,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return TBSM(arch, _embedding_collection(cfg, sizes, data, device), seed=cfg.seed).to(device)


def make_dense_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
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


class _Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds


def set_flush_denormal(on: bool) -> bool:
    """Denormal floats (magnitude below 1.2e-38, fp32 and bf16 alike) read and written as zero on
    the CPU (x86 DAZ/FTZ), or not. Every instruction with a denormal operand takes a microcode
    assist: measured here, oneDNN's bf16 batched matmul of the interaction ran 4-5x slower
    whenever the scratch memory the allocator handed it uninitialised held denormal bit patterns
    (freed small integers such as the batches' indices, or tiny floats), so the same step took
    111 ms or 165 ms depending on the allocator's history. Values that small are far below
    anything a recommendation model's weights, activations or gradients carry.

    The setting is per thread: the calling thread's, inherited by intra-op worker threads started
    after it, so the trainer applies it before it runs any parallel work. An application that ran
    multi-threaded torch work before building a Trainer should call `torch.set_flush_denormal`
    first thing. Returns whether the CPU supports it."""
    supported = torch.set_flush_denormal(on)
    if on and not supported:
        log.debug("this CPU cannot flush denormals; they stay")
    return supported


class Trainer:
    def __init__(self, cfg: TrainConfig, rank: int = 0, world_size: int = 1) -> None:
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.device = resolve_device(cfg.device)
        _check_run_dir_is_free(cfg)
        set_flush_denormal(cfg.flush_denormal)  # before any parallel work: see set_flush_denormal
        torch.manual_seed(cfg.seed)
        self.data = build_data(cfg, rank, world_size)
        self.model = build_model(cfg, self.data, self.device)
        self.data = placement.schedule_training_data(cfg, self.data, self.model.embeddings, self.steps_per_epoch())
        self.dense_optimizer = make_dense_optimizer(cfg, self.model.dense_parameters())
        self.state = TrainState()
        self.timer = _Timer()
        self.run_dir = cfg.run_dir
        self.ckpt_dir = self.run_dir / "checkpoints"
        self._lr = cfg.learning_rate
        self._autocast = cfg.precision == "bf16"
        show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
        self._progress = bool(show) and rank == 0
        self.perf_recorder = None
        if cfg.perf_log:  # only then: no profiler or labels on the hot path otherwise
            from dlrm.perfmodel.recorder import StepRecorder

            self.perf_recorder = StepRecorder(self, cfg.perf_log)
        if cfg.load_model:
            self._load_model_file(Path(cfg.load_model))
        if cfg.resume:
            self.load_checkpoint(ckpt.resolve_resume(cfg.resume, self.run_dir))

    # --- run directory ------------------------------------------------------------------------

    def _open_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.run_dir / "config.json"
        if not config_path.exists() or not self.cfg.resume:
            config_path.write_text(json.dumps(self.cfg.to_json(), indent=2) + "\n")

    def _event(self, event: str, **fields) -> None:
        if self.rank != 0:
            return
        record = {"event": event, "step": self.state.step, "epoch": self.state.epoch, **fields}
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # --- one step -----------------------------------------------------------------------------

    def _set_learning_rate(self) -> float:
        c = self.cfg
        lr = learning_rate_at(
            self.state.step, c.learning_rate, c.lr_num_warmup_steps, c.lr_decay_start_step, c.lr_num_decay_steps
        )
        if lr != self._lr:
            for group in self.dense_optimizer.param_groups:
                group["lr"] = lr
            self.model.embeddings.set_learning_rate(lr)
            self._lr = lr
        return lr

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.cfg.loss_function == "mse":
            return F.mse_loss(torch.sigmoid(logits), labels)
        return F.binary_cross_entropy_with_logits(logits, labels)

    def train_step(self, batch) -> torch.Tensor:
        """One optimisation step on a batch already on the device; returns the loss."""
        self._set_learning_rate()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast):
            logits = self.model(batch.dense_features, batch.sparse_features)
        loss = self._loss(logits, batch.labels)
        if not math.isfinite(loss.item()):
            raise TrainingDiverged(
                f"non-finite loss ({loss.item()}) at step {self.state.step} "
                f"(epoch {self.state.epoch}, batch {self.state.batch_in_epoch}); "
                f"last good checkpoint: {self._last_checkpoint() or 'none'}"
            )
        self.dense_optimizer.zero_grad(set_to_none=True)
        loss.backward()  # also applies the fused sparse updates
        self.dense_optimizer.step()
        return loss.detach()

    # --- the loop -----------------------------------------------------------------------------

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
        bar = tqdm(total=total, initial=st.step, disable=not self._progress, desc="train", unit="batch")
        stop = st.stop_reason != "" or st.step >= total
        step_fn = self.perf_recorder.step if self.perf_recorder is not None else self.train_step
        while not stop and st.epoch < cfg.nepochs:
            loop_start = time.perf_counter()
            batches = self.data.train.batches(st.epoch, start=st.batch_in_epoch)
            while st.batch_in_epoch < per_epoch:
                t0 = time.perf_counter()
                batch = next(batches).to(self.device, non_blocking=True)
                t1 = time.perf_counter()
                loss = step_fn(batch)
                t2 = time.perf_counter()
                self.timer.add("data_s", t1 - t0)
                self.timer.add("compute_s", t2 - t1)
                phase = getattr(self.model.embeddings, "last_phase", None)  # fae: hot or cold
                if phase:
                    self.timer.add(f"{phase}_s", t2 - t1)
                st.step += 1
                st.batch_in_epoch += 1
                st.samples += batch.labels.numel()
                st.loss_sum += loss.item()
                st.loss_count += 1
                bar.update(1)
                if cfg.print_freq and st.step % cfg.print_freq == 0:
                    st.train_time_s += time.perf_counter() - loop_start
                    self._log_train(bar)
                    loop_start = time.perf_counter()
                if cfg.test_freq and st.step % cfg.test_freq == 0 and st.batch_in_epoch < per_epoch:
                    st.train_time_s += time.perf_counter() - loop_start
                    stop = self._evaluate_and_checkpoint()
                    loop_start = time.perf_counter()
                    if stop:
                        break
            st.train_time_s += time.perf_counter() - loop_start
            if stop:
                break
            if st.batch_in_epoch >= per_epoch:
                st.epoch += 1
                st.batch_in_epoch = 0
                stop = self._evaluate_and_checkpoint() or stop
        bar.close()
        if not st.stop_reason:
            st.stop_reason = "completed"
        if cfg.save_model:
            self.save_model_file(Path(cfg.save_model))
        return self._write_summary()

    def _log_train(self, bar) -> None:
        st = self.state
        mean_loss = st.loss_sum / max(st.loss_count, 1)
        rate = st.samples / st.train_time_s if st.train_time_s > 0 else 0.0
        self._event("train", loss=mean_loss, lr=self._lr, samples=st.samples, samples_per_s=rate,
                    **placement.transfer_counters(self.model.embeddings, self.timer.totals))  # fmt: skip
        bar.set_postfix(loss=f"{mean_loss:.4f}")
        log.info("step %d: loss %.5f, %.0f samples/s", st.step, mean_loss, rate)
        st.loss_sum, st.loss_count = 0.0, 0

    def _evaluate_and_checkpoint(self) -> bool:
        """Evaluate, checkpoint, and say whether the AUC threshold was reached."""
        metrics = self.evaluate()
        self.state.last_eval = metrics
        self._event("eval", **{f"test_{k}": v for k, v in metrics.items()})
        reached = bool(self.cfg.mlperf_auc_threshold) and metrics["auc"] >= self.cfg.mlperf_auc_threshold
        if reached:
            self.state.stop_reason = "auc_threshold"
        self.save_checkpoint()
        return reached

    @torch.no_grad()
    def evaluate(self) -> dict:
        t0 = time.perf_counter()
        placement.sync_tiers(self.model.embeddings)
        self.model.eval()
        logits, labels = [], []
        batches = self.data.test.batches(0)
        for batch in tqdm(batches, total=len(self.data.test), disable=not self._progress, desc="eval", leave=False):
            batch = batch.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast):
                logits.append(self.model(batch.dense_features, batch.sparse_features).float())
            labels.append(batch.labels)
        self.model.train()
        metrics = binary_metrics(torch.cat(logits), torch.cat(labels))
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
        emb = self.model.embeddings
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
            "time_breakdown_s": dict(self.timer.totals),
            "device": str(self.device),
            "precision": self.cfg.precision,
            "placement": placement.placement_summary(emb, self.device),
        }
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    # --- checkpoints --------------------------------------------------------------------------

    def _last_checkpoint(self) -> Path | None:
        found = ckpt.list_checkpoints(self.ckpt_dir)
        return found[-1] if found else None

    def checkpoint_state(self) -> dict:
        st = self.state
        placement.sync_tiers(self.model.embeddings)
        return {
            **placement.checkpoint_extra(self.model.embeddings),
            "format": ckpt.FORMAT,
            "version": ckpt.VERSION,
            "arch": self.cfg.arch_signature(),
            "model": self.model.state_dict(),
            "sparse_optimizer": self.model.embeddings.sparse_state_dict(),
            "dense_optimizer": self.dense_optimizer.state_dict(),
            "train_state": {
                "step": st.step,
                "epoch": st.epoch,
                "batch_in_epoch": st.batch_in_epoch,
                "samples": st.samples,
                "train_time_s": st.train_time_s,
                "loss_sum": st.loss_sum,
                "loss_count": st.loss_count,
                "last_eval": json.dumps(st.last_eval),
                "stop_reason": st.stop_reason,
            },
            "rng": ckpt.rng_state(),
        }

    def save_checkpoint(self) -> Path | None:
        if self.rank != 0:
            return None
        t0 = time.perf_counter()
        path = ckpt.checkpoint_path(self.ckpt_dir, self.state.step)
        ckpt.atomic_save(self.checkpoint_state(), path)
        ckpt.prune(self.ckpt_dir, self.cfg.keep_checkpoints)
        self._event("checkpoint", path=str(path))
        self.timer.add("checkpoint_s", time.perf_counter() - t0)
        return path

    def load_checkpoint(self, path: Path) -> None:
        data = ckpt.load(path)
        if data.get("arch") != self.cfg.arch_signature():
            raise CheckpointError(f"{path}: written for a different model or optimizer ({data.get('arch')})")
        self._load_model_state(data["model"], path)
        try:
            self.model.embeddings.load_sparse_state_dict(data["sparse_optimizer"])
            self.dense_optimizer.load_state_dict(data["dense_optimizer"])
        except (KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: optimizer state does not fit ({e})") from None
        placement.load_checkpoint_extra(self.model.embeddings, data)
        ts = dict(data["train_state"])
        ts["last_eval"] = json.loads(ts["last_eval"])
        self.state = TrainState(**ts)
        ckpt.set_rng_state(data["rng"])
        self._lr = float("nan")  # force the LR of the next step to be applied
        log.info("resumed from %s at step %d", path, self.state.step)

    def _load_model_state(self, state: dict, path: Path) -> None:
        try:
            result = self.model.load_state_dict(state, strict=False)
        except RuntimeError as e:  # shape mismatches
            raise CheckpointError(f"{path}: does not fit the model ({str(e).splitlines()[-1].strip()})") from None
        problems = list(result.missing_keys) + list(result.unexpected_keys)
        if problems:
            raise CheckpointError(f"{path}: does not fit the model (keys {', '.join(problems[:4])})")

    def save_model_file(self, path: Path) -> None:
        """Weights only (no optimizer), for --load-model and inference."""
        ckpt.atomic_save(
            {"format": ckpt.FORMAT, "version": ckpt.VERSION, "arch": self.cfg.arch_signature(),
             "model": self.model.state_dict()},
            path,
        )  # fmt: skip

    def _load_model_file(self, path: Path) -> None:
        if not path.exists():
            raise CheckpointError(f"--load-model: no such file: {path}")
        self._load_model_state(ckpt.load(path)["model"], path)
