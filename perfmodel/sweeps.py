"""Kernel microbenchmarks: the operators that dominate DLRM steps, swept over their shapes.

Each benchmark runs a piece of the model forward and backward (so the backward kernels have the
layouts autograd really uses) under the profiler, `reps` times, and records every kernel with
its median duration, in the kernel-record format of the perf traces (see
`perfmodel.features`). Sweeps:

- ``gemm``: addmm, the two backward mm, DCN's cross layers' bias-free mm (forward and
  backward) and the two bmm of the interaction in the layouts training uses, timed directly by thread-CPU time (the GEMM models are fitted on these only:
  they are the long kernels, and wall-clock profiler times of long kernels on a shared machine
  include other processes' time slices);
- ``mlp``: Linear(+ReLU) forward/backward (addmm, the two mm of AddmmBackward0, the bias sum,
  threshold_backward, autocast casts under bf16) and the SGD update, over batch, widths, dtype;
- ``interaction``: the dot interaction (cat, the transposed copy, bmm, index_select; backward:
  the gather of the symmetric gradient matrix and one bmm) over batch, number of features, dimension and dtype;
- ``embedding``: the fused table-batched lookup forward and backward with the fused optimizer,
  over batch, tables, rows (half the draws with tables of one size class, half a Criteo-like mix
  of tiny and large tables), dimension, Zipf skew, optimizer and pooling (ids per bag: one, as
  in Criteo, for about half the draws, multi-hot bags of mean 2-16 for the rest), each draw's
  reps cycling through 16 distinct index batches;
- ``elementwise``: the element-wise kernels around a linear layer at training sizes (the bias
  gradient's column sum, in-place ReLU, threshold_backward, the autocast casts) over rows,
  width and dtype: the ``mlp`` sweep draws small layers too, and these kernels' cost per byte
  changes once a tensor outgrows the caches; DCN's cross-layer element-wise ops (forward and
  backward of x0 * (h + b) + x) over rows and width; and the trainer's fused dense optimizer step
  (SGD or Adagrad) over random MLPs of 10^4 to 3x10^6 parameters;
- ``loss``: BCE with logits and its backward over batch;
- ``copy``: element-wise ops, a table tier's sparse update in the PyTorch path (the per-row
  gradient sum by index_add_, the unique-row update by index_select/add_/index_copy_, the dirty
  flags by index_fill_) and host-to-device copies (CUDA only) over sizes.

Every draw of a sweep is measured on a steady machine (`hardware.SteadyGate`: the canary before
and after each draw, the draw retried after a 1 s pause while it ran more than 15% slower, at
most four tries and 90 s of pauses per sweep); per sweep, `microbench.json` has the draws'
median and worst slowdown, the retries and the draws kept slow, and each record its draw's
``machine_slowdown``. The fit divides the ``gemm`` sweep's durations by it (`at_described_speed`).
"""

# Each sweep's step closure is run by profile_kernels within the same loop iteration.
# ruff: noqa: B023
from __future__ import annotations

import logging
import math
import random
import statistics
import time

import torch

from dlrm.models.dlrm import NARROW_INPUT, PAD_INPUT_TO
from perfmodel import hardware
from perfmodel import trace as tr
from perfmodel.features import on_device

log = logging.getLogger(__name__)


# A kernel longer than this is likely to be preempted on a shared machine whatever the rep.
LONG_KERNEL_US = 1000.0


def profile_kernels(fn, reps: int = 5, ctx: dict | None = None) -> list[dict]:
    """Run fn once to warm, then `reps` times under the profiler; one record per kernel position.

    On a machine shared with other processes the profiler's wall-clock durations include time
    the thread was descheduled: see `kernel_estimate`.
    """
    return _with_slowdown(_gated(lambda: _profile_kernels(fn, reps, ctx)))


def _profile_kernels(fn, reps: int, ctx: dict | None) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from perfmodel.hardware import profiler_event_cost_us

    cuda = _on_cuda()
    fn()
    ratios = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(reps):
            w0, c0 = time.perf_counter(), time.thread_time()
            with torch.autograd.profiler.record_function(tr.STEP_LABEL):
                fn()
                if cuda:
                    torch.cuda.synchronize()
            # device kernels' durations are the device's: the host's descheduling is not in them
            cpu_share = (time.thread_time() - c0) / max(time.perf_counter() - w0, 1e-9)
            ratios.append(1.0 if cuda else min(cpu_share, 1.0))
    steps = tr.graph_from_events(prof.events(), uses_cuda=cuda)
    per_rep = [[k for op in st["ops"] for k in op["kernels"]] for st in steps]
    # kernels are matched by position across the reps that ran the most common sequence (a rep
    # with a one-off kernel, e.g. a cached value computed on first use, would shift the rest)
    sigs = [tuple(k["name"] for k in r) for r in per_rep]
    common = max(set(sigs), key=lambda g: (sigs.count(g), -sigs.index(g)))
    keep = [i for i, g in enumerate(sigs) if g == common]
    per_rep, ratios = [per_rep[i] for i in keep], [ratios[i] for i in keep]
    out = []
    cost = profiler_event_cost_us()
    for i in range(len(common)):
        k = dict(per_rep[0][i])
        k["dur_us"] = kernel_estimate([r[i]["dur_us"] for r in per_rep], ratios)
        k["ctx"] = dict(ctx or {})
        k["event_cost_us"] = cost
        k.pop("start_us", None)
        out.append(k)
    return out


def kernel_estimate(durations: list[float], ratios: list[float]) -> float:
    """One kernel's time from its wall-clock durations in several reps (or steps) and those reps'
    thread-CPU / wall ratios: the median over reps, a long kernel's durations first scaled by
    its rep's ratio (a kernel longer than a scheduler slice is preempted in proportion to the
    rep's descheduled share). Medians, like the step times they add up to, are robust to the
    bursts of interference of a shared machine."""
    if statistics.median(durations) <= LONG_KERNEL_US:
        return statistics.median(durations)
    return statistics.median(d * r for d, r in zip(durations, ratios))


# While `run` sweeps, every draw's measurement is checked by the canary (see hardware.SteadyGate).
_GATE: hardware.SteadyGate | None = None


def _gated(measure):
    return _GATE.run(measure) if _GATE is not None else measure()


def _with_slowdown(recs: list[dict]) -> list[dict]:
    """The records of the draw just measured, each with the draw's `machine_slowdown` (the
    worse canary around it, as a multiple of the described one) when a gate measured it."""
    if _GATE is not None and _GATE.slowdowns:
        for r in recs:
            r["machine_slowdown"] = _GATE.slowdowns[-1]
    return recs


# Sweeps whose durations the fit divides by their draw's slowdown (see `at_described_speed`).
NORMALISED_SWEEPS = ("gemm",)


def at_described_speed(rec: dict, dur_us: float) -> float:
    """A microbenchmark duration as on the machine when it was described: a draw of the
    ``gemm`` sweep divided by its `machine_slowdown` (a bf16 GEMM by its bf16 canary's,
    `machine_slowdown_bf16`: a neighbour that slows fp32 matmuls 1.4x may leave bf16 ones
    alone, and dividing them by the fp32 canary made big bf16 GEMMs 28% too fast). The canary
    is itself small matmuls and a copy; measured here, its slowdown follows isolated GEMMs'
    (correlation ~0.8) but not the memory-bound kernels' or whole steps' (~0.3), so the other
    sweeps are left as measured. The in-situ factors (`KernelModels.calibrate_in_situ`) carry
    GEMMs from the described speed to the speed inside steps."""
    slow = rec.get("machine_slowdown_bf16") or rec.get("machine_slowdown")
    # the canary times the CPU, not a CUDA device
    if rec.get("sweep") in NORMALISED_SWEEPS and slow and not on_device(rec):
        return dur_us / float(slow)
    return dur_us


# Where the sweeps run: the CUDA device when there is one (the trainer's dense part and its
# device tables run there), else the CPU. `run` sets it; the sweeps allocate on it.
DEVICE = torch.device("cpu")


def _on_cuda() -> bool:
    return DEVICE.type == "cuda"


def time_call(fn, reps: int = 7) -> float:
    """Median microseconds of fn() after one warm call: on CPU thread-CPU time (it ignores the
    time the thread was descheduled; the median ignores bursts of interference), on CUDA the
    device time between two events around the call."""
    return _gated(lambda: _time_call(fn, reps))


def _time_call(fn, reps: int) -> float:
    if _on_cuda():
        return statistics.median(hardware.cuda_event_seconds(fn, reps)) * 1e6
    fn()
    ts = []
    for _ in range(reps):
        c0 = time.thread_time()
        fn()
        ts.append((time.thread_time() - c0) * 1e6)
    return statistics.median(ts)


def _gemm_record(name: str, tensors: list, dur: float, ctx: dict) -> dict:
    dt = {torch.float32: "float", torch.bfloat16: "c10::BFloat16"}
    stream = "cuda:0" if tensors[-1].is_cuda else "cpu"
    return {"name": name, "stream": stream, "dur_us": dur, "n_events": 1, "launch_us": 0.0,
            "shapes": [list(t.shape) for t in tensors], "strides": [list(t.stride()) for t in tensors],
            "dtypes": [dt[t.dtype] for t in tensors], "ctx": ctx, "event_cost_us": 0.0}  # fmt: skip


def _timed_gemm(name: str, tensors: list, fn, reps: int, ctx: dict) -> dict:
    """One gated thread-CPU timing of a GEMM, as a kernel record with its draw's slowdown; a
    bf16 GEMM also with the bf16 canary's, measured right after it (`at_described_speed`)."""
    rec = _with_slowdown([_gemm_record(name, tensors, time_call(fn, reps), ctx)])[0]
    if _GATE is not None and tensors[-1].dtype == torch.bfloat16 and _GATE.hw.get("canary_bf16_us"):
        rec["machine_slowdown_bf16"] = hardware.slowdown(_GATE.hw, torch.bfloat16)
    return rec


_WIDE = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536]


def linear_gemms(
    b: int, fi: int, fo: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> list[tuple[str, list, object]]:
    """The GEMMs of one MLP layer's training step, (name, operands, call), in the layouts the
    trainer's autograd runs them: forward addmm(bias, x, W.t()) (W.t() contiguous for narrow
    inputs, see `NarrowInputLinear`; inputs padded to a multiple of 8 wide otherwise, see
    `PaddedInputLinear`), input gradient mm(g, W), and the weight gradient x^T g for
    a row-major weight operand or (g^T x)^T for a transposed view (`mm_mat2_backward` keeps the
    weight's layout)."""
    narrow = fi < NARROW_INPUT
    if not narrow:  # `PaddedInputLinear`: the reduction width padded with zeros
        fi = -(-fi // PAD_INPUT_TO) * PAD_INPUT_TO
    x, w = torch.randn(b, fi, device=device).to(dtype), torch.randn(fo, fi, device=device).to(dtype)
    bias, g = torch.randn(fo, device=device).to(dtype), torch.randn(b, fo, device=device).to(dtype)
    w_t = w.t().contiguous() if narrow else w.t()
    wgrad = [x.t(), g] if narrow else [g.t(), x]
    return [
        ("aten::addmm", [bias, x, w_t], lambda: torch.addmm(bias, x, w_t)),
        ("aten::mm", [g, w], lambda: torch.mm(g, w)),
        ("aten::mm", wgrad, lambda: torch.mm(*wgrad)),
    ]


# DCN's cross layers (`LowRankCrossNet`): the width of their input, (tables + 1) x dimension
# (432 for Kaggle's 26 tables at 16, 3456 for MLPerf's DLRM-DCNv2 at 128), and their rank.
CROSS_WIDTH = (64, 4096)
CROSS_RANK = (8, 1024)


def cross_layer_gemms(
    b: int, width: int, rank: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> list[tuple[str, list, object]]:
    """The GEMMs of one DCN cross layer's training step, (name, operands, call), in the layouts
    autograd runs them: two bias-free linears, x V^T ([B, width] -> [B, rank]) and h W^T
    ([B, rank] -> [B, width]), each forward mm(x, W.t()) (a transposed view: no bias, so no
    addmm and no padding), input gradient mm(g, W) and weight gradient mm(g.t(), x)."""
    out = []
    for fi, fo in ((width, rank), (rank, width)):
        x = torch.randn(b, fi, device=device).to(dtype)
        w, g = (
            torch.randn(fo, fi, device=device).to(dtype),
            torch.randn(b, fo, device=device).to(dtype),
        )
        out += [
            ("aten::mm", [x, w.t()], lambda x=x, w=w: torch.mm(x, w.t())),
            ("aten::mm", [g, w], lambda g=g, w=w: torch.mm(g, w)),
            ("aten::mm", [g.t(), x], lambda g=g, x=x: torch.mm(g.t(), x)),
        ]
    return out


def bench_gemm(rng: random.Random, n: int, reps: int) -> list[dict]:
    """addmm/mm/bmm timed directly by thread-CPU time in the layouts training uses: an MLP
    layer's three GEMMs (`linear_gemms`), a DCN cross layer's six (`cross_layer_gemms`), the
    dot interaction's bmm(t^T^T, t^T) (t^T contiguous) and its backward bmm(G, t) (see
    `_DotInteractionFn`)."""
    out = []
    for _ in range(n):
        dtype = torch.bfloat16 if rng.random() < 0.5 else torch.float32
        if rng.random() < 0.2:  # a cross layer's bias-free GEMMs: forward mm(x, W.t())
            b = _log_uniform(rng, 16, 4096)
            width, rank = _log_uniform(rng, *CROSS_WIDTH), _log_uniform(rng, *CROSS_RANK)
            if 2 * b * width * rank > (6e9 if dtype == torch.float32 else 2.5e9):
                continue
            for name, args, fn in cross_layer_gemms(b, width, rank, dtype, DEVICE):
                out.append(_timed_gemm(name, args, fn, reps, {"batch_size": b}))
        elif rng.random() < 0.75:
            if rng.random() < 0.5:  # anywhere in the range
                b = _log_uniform(rng, 16, 4096)
                fi, fo = _log_uniform(rng, 1, 1024), _log_uniform(rng, 1, 1024)
            else:  # the big end, on a generic grid (powers of two and 1.5x), where time goes
                b = rng.choice([256, 512, 1024, 2048, 4096])
                fi, fo = rng.choice(_WIDE), rng.choice(_WIDE)
            if rng.random() < 0.2:  # the logit layer: one output, matrix-vector shaped GEMMs
                fo = 1
            if 2 * b * fi * fo > (6e9 if dtype == torch.float32 else 2.5e9):
                continue
            for name, args, fn in linear_gemms(b, fi, fo, dtype, DEVICE):
                out.append(_timed_gemm(name, args, fn, reps, {"batch_size": b}))
        else:
            b = _log_uniform(rng, 16, 4096)
            f, d = rng.choice([4, 8, 13, 18, 27, 33]), rng.choice([8, 16, 32, 64, 128])
            t = torch.randn(b, f, d, device=DEVICE).to(dtype)
            t_t = t.transpose(1, 2).contiguous()
            gz = torch.randn(b, f, f, device=DEVICE).to(dtype)
            for args, fn in (
                ([t_t.transpose(1, 2), t_t], lambda: torch.bmm(t_t.transpose(1, 2), t_t)),
                ([gz, t], lambda: torch.bmm(gz, t)),
            ):
                out.append(_timed_gemm("aten::bmm", args, fn, reps, {"batch_size": b}))
    return out


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def bench_mlp(rng: random.Random, n: int, reps: int) -> list[dict]:
    out = []
    for _ in range(n):
        b = _log_uniform(rng, 64, 4096)
        fi, fo = _log_uniform(rng, 4, 1024), _log_uniform(rng, 1, 1024)
        if 2 * b * fi * fo * 3 > 3e9:
            continue
        bf16 = rng.random() < 0.5
        lin = torch.nn.Linear(fi, fo, device=DEVICE)
        x = torch.randn(b, fi, device=DEVICE, requires_grad=rng.random() < 0.8)
        opt = torch.optim.SGD(lin.parameters(), lr=0.01)

        def step() -> None:
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=bf16):
                y = torch.relu(lin(x))
            y.float().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            x.grad = None

        out += profile_kernels(
            step, reps, {"precision": "bf16" if bf16 else "fp32", "batch_size": b}
        )
    return out


def bench_interaction(rng: random.Random, n: int, reps: int) -> list[dict]:
    from dlrm.models.dlrm import Interaction

    out = []
    for _ in range(n):
        b = _log_uniform(rng, 64, 4096)
        feats = rng.choice([4, 8, 13, 18, 27, 33])
        dim = rng.choice([8, 16, 32, 64, 128])
        if b * feats * feats * dim > 4e8:
            continue
        bf16 = rng.random() < 0.5
        inter = Interaction(feats, "dot", False).to(DEVICE)
        dense = torch.randn(b, dim, device=DEVICE, requires_grad=True)
        sparse = torch.randn(b, (feats - 1) * dim, device=DEVICE, requires_grad=True)

        def step() -> None:
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=bf16):
                z = inter(dense, sparse)
            z.float().sum().backward()
            dense.grad = sparse.grad = None

        out += profile_kernels(
            step, reps, {"precision": "bf16" if bf16 else "fp32", "batch_size": b}
        )
    return out


def pooled_kjt(keys: list[str], rows: torch.Tensor, lengths: torch.Tensor):
    """A KeyedJaggedTensor of multi-hot bags: feature f's bags take, in order, the first
    ``lengths[f].sum()`` ids of its row stream ``rows[f]``. rows [T, N] int64, lengths [T, B]."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    totals = lengths.sum(1).tolist()
    values = torch.cat([rows[f, :n] for f, n in enumerate(totals)])
    flat = lengths.reshape(-1)
    offsets = torch.cat([flat.new_zeros(1), torch.cumsum(flat, 0)])  # given, as the loaders do
    return KeyedJaggedTensor(keys=keys, values=values, lengths=flat.to(torch.int32), offsets=offsets,
                             stride=lengths.shape[1])  # fmt: skip


# Mean ids per bag of the embedding sweep's draws: one-hot as in Criteo for half of them,
# multi-hot bags (history features, MLPerf's multi-hot Criteo) for the rest.
POOLING = (1, 1, 1, 2, 4, 8, 16)


def bench_embedding(rng: random.Random, n: int, reps: int) -> list[dict]:
    from data_pipeline.synthetic import PlantedWorld, SyntheticConfig
    from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, tables_for_features

    out = []
    for _ in range(n):
        b = _log_uniform(rng, 64, 4096)
        tables = rng.choice([4, 8, 16, 26])
        rows = _log_uniform(rng, 100, 500_000)
        if rng.random() < 0.5:  # tables of one size class
            sizes = [max(2, int(rows * rng.uniform(0.2, 1.0))) for _ in range(tables)]
        else:  # a mix of tiny and large tables, as in Criteo (3 to 10^7 rows in one dataset)
            sizes = [_log_uniform(rng, 2, rows) for _ in range(tables)]
        dim = rng.choice([8, 16, 32, 64])
        alpha = rng.choice([0.0, 0.8, 1.05, 1.2])
        opt = rng.choice(["sgd", "sgd", "rowwise_adagrad", "adagrad"])
        pooling = rng.choice(POOLING)
        b = max(16, min(b, 16384 // pooling))  # at most 16384 ids per table and batch
        world = PlantedWorld(
            SyntheticConfig(table_sizes=sizes, zipf_alpha=alpha, seed=rng.randrange(1000))
        )
        emb = FusedEmbeddingBagCollection(
            tables_for_features(sizes, dim), SparseOptimizer(opt, 0.01), device=DEVICE
        )
        # at least 16 distinct batches, cycled: inside a training step a lookup's indices come
        # from a new batch, not from the cache the previous rep left them in. Multi-hot bags
        # hold 1 to 2 x pooling - 1 ids (mean `pooling`).
        n_batches = 16
        gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
        lengths = [torch.randint(1, 2 * pooling, (tables, b), generator=gen) if pooling > 1
                   else torch.ones(tables, b, dtype=torch.int64) for _ in range(n_batches)]  # fmt: skip
        per_batch = [int(ln.sum(1).max()) for ln in lengths]
        chunks = -(-sum(per_batch) // 8192)
        threads = torch.get_num_threads()
        rows_t = torch.cat([world.chunk("train", c)[0] for c in range(chunks)], dim=1)
        # numba's OpenMP layer sets torch's intra-op threads to its own count on first use: a
        # 2-thread team beside another process's work ran fbgemm's backward 10-100x slower
        torch.set_num_threads(threads)
        starts = [sum(per_batch[:i]) for i in range(n_batches)]
        kjts = [pooled_kjt(world.feature_names, rows_t[:, s : s + m], ln).to(DEVICE)
                for s, m, ln in zip(starts, per_batch, lengths)]  # fmt: skip
        it = iter(range(1 << 30))

        def step() -> None:
            kjt = kjts[next(it) % len(kjts)]
            emb(kjt).values().sum().backward()

        ctx = {
            "table_sizes": sizes,
            "embedding_dim": dim,
            "zipf": alpha,
            "optimizer": opt,
            "batch_size": b,
        }
        out += profile_kernels(step, reps, ctx)
    return out


def bench_elementwise(rng: random.Random, n: int, reps: int) -> list[dict]:
    out = []
    for _ in range(n):
        b, w = _log_uniform(rng, 64, 8192), _log_uniform(rng, 1, 2048)
        if b * w > 1 << 23:
            continue
        dtype = torch.bfloat16 if rng.random() < 0.5 else torch.float32
        other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
        x, g = (
            torch.randn(b, w, dtype=dtype, device=DEVICE),
            torch.randn(b, w, dtype=dtype, device=DEVICE),
        )

        def step() -> None:
            x.sum(0)
            x.clamp_min_(0.0)
            torch.ops.aten.threshold_backward(g, x, 0.0)
            x.to(other)

        out += profile_kernels(step, reps, {"batch_size": b})
        if rng.random() < 0.3:
            out += _dense_optimizer_records(rng, reps)
        if rng.random() < 0.3:
            out += _cross_layer_elementwise_records(rng, reps)
    return out


def _cross_layer_elementwise_records(rng: random.Random, reps: int) -> list[dict]:
    """The element-wise kernels of a DCN cross layer, x0 * (h + b) + x, forward and backward
    (the bias add in the GEMM output's dtype against a float32 bias, the float32 products and
    sums, the bias gradient's column sum, the gradients' casts under bf16) over rows and the
    cross layers' width (`CROSS_WIDTH`): no other sweep runs a float32 `mul` of two tensors or
    a mixed-dtype `add` at these sizes."""
    b, w = _log_uniform(rng, 64, 4096), _log_uniform(rng, *CROSS_WIDTH)
    if b * w > 1 << 22:
        return []
    bf16 = rng.random() < 0.5
    x0, x = (torch.randn(b, w, device=DEVICE, requires_grad=True) for _ in range(2))
    h = torch.randn(b, w, device=DEVICE).to(torch.bfloat16 if bf16 else torch.float32)
    h.requires_grad_(True)
    bias = torch.zeros(w, device=DEVICE, requires_grad=True)
    g = torch.randn(b, w, device=DEVICE)

    def step() -> None:
        (x0 * (h + bias) + x).backward(g)
        x0.grad = x.grad = h.grad = bias.grad = None

    return profile_kernels(step, reps, {"precision": "bf16" if bf16 else "fp32", "batch_size": b})


def _dense_optimizer_records(rng: random.Random, reps: int) -> list[dict]:
    """The trainer's fused dense optimizer step over an MLP's parameters (a random stack of
    2-4 layers, 10^4 to 3x10^6 parameters): its kernel sees tensor lists, whose shapes the
    profiler does not record, so the record carries the parameter count (`dense_params`)."""
    widths = [_log_uniform(rng, 8, 2048) for _ in range(rng.randint(3, 5))]
    params = []
    for fi, fo in zip(widths, widths[1:]):
        params += [torch.nn.Parameter(torch.randn(fo, fi, device=DEVICE)),
                   torch.nn.Parameter(torch.randn(fo, device=DEVICE))]  # fmt: skip
    n = sum(p.numel() for p in params)
    if n > 3_000_000:
        return []
    for p in params:
        p.grad = torch.randn_like(p)
    if rng.random() < 0.75:
        opt = torch.optim.SGD(params, lr=0.01, fused=True)
    else:
        opt = torch.optim.Adagrad(params, lr=0.01, eps=1e-8, fused=True)
    return profile_kernels(opt.step, reps, {"dense_params": n})


def bench_loss(rng: random.Random, n: int, reps: int) -> list[dict]:
    out = []
    for _ in range(n):
        b = _log_uniform(rng, 64, 8192)
        logits = torch.randn(b, device=DEVICE, requires_grad=True)
        labels = (torch.rand(b, device=DEVICE) < 0.3).float()

        def step() -> None:
            torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()
            logits.grad = None

        out += profile_kernels(step, reps, {"batch_size": b})
    return out


def _sparse_update_step(rng: random.Random, device: torch.device):
    from embeddings.torch_tbe import add_unique_rows

    rows, dim = _log_uniform(rng, 1 << 10, 1 << 20), rng.choice([8, 16, 32, 64])
    k = _log_uniform(rng, 64, 1 << 17)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    uniq = max(1, min(rows, int(k * rng.uniform(0.05, 1.0))))
    table = torch.zeros(rows, dim, device=device)
    dirty = torch.zeros(rows, dtype=torch.bool, device=device)
    unique_rows = torch.randperm(rows, generator=gen)[:uniq].to(device)
    inverse = torch.randint(uniq, (k,), generator=gen).to(device)
    per_lookup = torch.randn(k, dim, generator=gen).to(device)

    def step() -> None:
        grad = torch.zeros(uniq, dim, device=device).index_add_(0, inverse, per_lookup)
        add_unique_rows(table, unique_rows, grad, -0.01)
        dirty.index_fill_(0, unique_rows, True)

    return step


def bench_copy(rng: random.Random, n: int, reps: int) -> list[dict]:
    out = []
    for _ in range(n):
        numel = _log_uniform(rng, 64, 1 << 22)
        a = torch.randn(numel, device=DEVICE)
        bf = torch.empty(numel, dtype=torch.bfloat16, device=DEVICE)

        def step() -> None:
            bf.copy_(a)
            a.copy_(bf)
            a.add_(1.0)
            torch.relu(a)

        out += profile_kernels(step, reps, {})
        # row scatters of a table tier's sparse update (FAE's device tier, the PyTorch path):
        # the per-row gradient sum (index_add_ of k lookups into u unique rows), the update of
        # those rows (gather, add, index_copy_) and the dirty-row flags (index_fill_)
        out += profile_kernels(_sparse_update_step(rng, DEVICE), reps, {})
        if _on_cuda():  # the host tier's updates run on the CPU; its rows cross to the device
            out += profile_kernels(_sparse_update_step(rng, torch.device("cpu")), reps, {})
            pinned = torch.randn(numel).pin_memory()
            dev = torch.empty(numel, device=DEVICE)
            out += profile_kernels(lambda: dev.copy_(pinned, non_blocking=True), reps, {})
    return out


SWEEPS = {"gemm": bench_gemm, "mlp": bench_mlp, "interaction": bench_interaction,
          "embedding": bench_embedding, "elementwise": bench_elementwise, "loss": bench_loss,
          "copy": bench_copy}  # fmt: skip
DEFAULT_COUNTS = {
    "gemm": 400,
    "mlp": 60,
    "interaction": 40,
    "embedding": 60,
    "elementwise": 80,
    "loss": 10,
    "copy": 40,
}
