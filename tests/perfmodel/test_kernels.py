import json
import math
import random

import numpy as np
import pytest

from perfmodel import features as F
from perfmodel.kernel_models import (
    EmbeddingModel,
    GemmMLP,
    GemmRoofline,
    RooflineTable,
    gmae,
    hit_rate,
    nnls_relative,
)
from perfmodel.kernels import KernelModels


def test_nnls_relative_recovers_planted_coefficients():
    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(50), rng.uniform(1, 1e6, 50), rng.uniform(1, 1e3, 50)])
    w = np.array([5.0, 2e-4, 0.0])
    assert np.allclose(nnls_relative(X, X @ w), w, rtol=1e-3, atol=1e-9)


def _ew(numel, t=None):
    k = {"name": "aten::clamp_min", "shapes": [[numel], []], "dtypes": ["float", "Scalar"]}
    k["dur_us"] = t if t is not None else 3.0 + F.bytes_moved(k) / 8000.0
    return k


def test_roofline_table_recovers_fixed_cost_and_bandwidth():
    recs = [_ew(n) for n in (10, 1000, 50_000, 400_000, 2_000_000)]
    model = RooflineTable().fit(recs)
    c0, inv_bw = model.coefs["aten::clamp_min|float/Scalar"]
    assert c0 == pytest.approx(3.0, rel=1e-3) and 1 / inv_bw == pytest.approx(8000.0, rel=1e-3)
    assert model.predict(_ew(123_456)) == pytest.approx(_ew(123_456)["dur_us"], rel=1e-3)


def _gemm(m, n, k, bf16=0):
    dt = "c10::BFloat16" if bf16 else "float"
    rec = {"name": "aten::addmm", "shapes": [[n], [m, k], [k, n], [], []], "strides": [[1], [k, 1], [1, k], [], []],
           "dtypes": [dt, dt, dt, "Scalar", "Scalar"]}  # fmt: skip
    d = F.gemm_dims(rec)
    rec["dur_us"] = 2.0 + F.gemm_flops(d) / (40e3 if bf16 else 80e3) + F.gemm_bytes(d) / 1e4
    return rec


def test_gemm_dims_reads_layouts():
    d = F.gemm_dims(_gemm(64, 32, 16))
    assert (d["M"], d["N"], d["K"], d["ta"], d["tb"], d["bias"]) == (64, 32, 16, 0, 1, 1)


def test_gemm_roofline_recovers_planted_efficiency():
    rng = random.Random(0)
    recs = [_gemm(rng.choice([64, 256, 1024]), rng.choice([8, 64, 512]), rng.choice([13, 128, 1024]), b)
            for b in (0, 1) for _ in range(30)]  # fmt: skip
    model = GemmRoofline().fit(recs)
    assert gmae([model.predict(r) for r in recs], [r["dur_us"] for r in recs]) < 1e-3


def test_gemm_mlp_learns_a_smooth_function():
    rng = random.Random(1)
    recs = [
        _gemm(2 ** rng.randint(4, 11), 2 ** rng.randint(0, 10), 2 ** rng.randint(2, 10))
        for _ in range(150)
    ]
    model = GemmMLP(32, 2).fit(recs[:120], iters=150)
    assert gmae(model.predict_many(recs[120:]), [r["dur_us"] for r in recs[120:]]) < 0.25
    again = GemmMLP(state=model.to_json(), hidden=32, layers=2)
    assert np.allclose(again.predict_many(recs[:5]), model.predict_many(recs[:5]))


def test_hit_rate_limits():
    sizes = [1000, 5000]
    everything = hit_rate(sizes, 1.05, 512, 64, cache_bytes=1e9)
    assert everything["hit"] == pytest.approx(1.0)
    assert hit_rate(sizes, 1.05, 512, 64, cache_bytes=0)["hit"] == pytest.approx(0.0)
    # uniform access: the cache holds capacity/rows of each table's mass
    uniform = hit_rate([1000], 0.0, 512, 64, cache_bytes=64 * 250)
    assert uniform["hit"] == pytest.approx(0.25, abs=0.01)
    skewed = hit_rate([1000], 1.2, 512, 64, cache_bytes=64 * 250)["hit"]
    assert skewed > 0.6
    assert 0 < everything["unique"] < 2 * 512


def _emb(batch, rows, alpha, coefs):
    ctx = {
        "table_sizes": [rows] * 8,
        "embedding_dim": 16,
        "zipf": alpha,
        "optimizer": "sgd",
        "batch_size": batch,
    }
    rec = {"name": "fbgemm::split_embedding_codegen_forward_cpu",
           "shapes": [[rows * 8 * 16], [8], [9], [], [9], [batch * 8], [batch * 8 + 1]], "ctx": ctx}  # fmt: skip
    model = EmbeddingModel({}, cache_bytes=2e6)
    rec["dur_us"] = float(np.dot(coefs, model.terms(rec)))
    return rec


def test_embedding_model_recovers_planted_bytes_and_hit_rate_terms():
    coefs = [4.0, 0.01, 0.002, 0.0002, 0.0, 0.0005]
    recs = [
        _emb(b, r, a, coefs)
        for b in (128, 1024, 4096)
        for r in (100, 20_000, 400_000)
        for a in (0.0, 1.05)
    ]
    model = EmbeddingModel({}, cache_bytes=2e6).fit(recs)
    assert gmae([model.predict(r) for r in recs], [r["dur_us"] for r in recs]) < 0.01
    assert model.terms(recs[0])[1] == 128 * 8  # lookups from the indices tensor


def test_multi_hot_bags_count_their_ids():
    """With multi-hot bags the indices outnumber the bags: the lookups come from the indices
    tensor (found before the offsets, not as offsets - 1) and the unique rows a batch touches
    from its ids per table, as for a one-hot batch with that many samples."""
    one_hot = _emb(512, 20_000, 1.05, [0.0] * 6)
    multi = _emb(128, 20_000, 1.05, [0.0] * 6)
    multi["shapes"][5] = [512 * 8]  # 4 ids per bag: 128 bags x 8 tables, 4096 ids
    multi["dtypes"] = ["float", "long int", "int", "Scalar", "long int", "long int", "long int"]
    model = EmbeddingModel({}, cache_bytes=2e6)
    t_one, t_multi = model.terms(one_hot), model.terms(multi)
    assert t_multi[1] == 512 * 8  # lookups: the ids, not the bags
    assert t_multi[4] == pytest.approx(t_one[4])  # unique rows: 512 ids per table either way
    assert t_multi[5] == pytest.approx(t_one[5] / 4)  # pooled output: one row per bag
    assert (
        hit_rate([20_000] * 8, 1.05, 512, 64, 2e6)["unique"]
        > hit_rate([20_000] * 8, 1.05, 128, 64, 2e6)["unique"]
    )
    # fbgemm's backward: the gradient first, then weights, offsets arrays, indices, offsets
    bwd = {"shapes": [[172, 512], [208256], [8], [8], [9], [], [9], [], [5453], [1377], [], []],
           "dtypes": ["float", "float", "int", "long int", "int", "Scalar", "long int", "Scalar",
                      "long int", "long int", "Scalar", ""]}  # fmt: skip
    from perfmodel.kernel_models import _indices_arg

    assert _indices_arg(bwd) == 8


def test_pooled_kjt_takes_each_features_ids_in_order():
    import torch

    from perfmodel.sweeps import pooled_kjt

    rows = torch.arange(20).reshape(2, 10)
    lengths = torch.tensor([[1, 3], [2, 2]])
    kjt = pooled_kjt(["a", "b"], rows, lengths)
    assert kjt.values().tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert kjt.lengths().tolist() == [1, 3, 2, 2]
    assert kjt["b"].values().tolist() == [10, 11, 12, 13]
    assert kjt["b"].lengths().tolist() == [2, 2]


def test_kernel_models_pick_per_type_and_round_trip():
    recs = [_ew(n) for n in np.geomspace(10, 2e6, 12).astype(int)] + [
        _gemm(2 ** (4 + i % 7), 2 ** (i % 9), 2 ** (2 + i % 8)) for i in range(60)]  # fmt: skip
    models = KernelModels().fit(recs, cache_bytes=1e6)
    assert set(models.choice) == {"elementwise", "gemm"}
    assert models.errors["gemm"]["heldout_gmae"] < 0.05  # the planted function is a roofline
    again = KernelModels.from_json(models.to_json())
    assert math.isclose(again.predict(recs[3]), models.predict(recs[3]), rel_tol=1e-9)


def _index_add(rows, k, alpha, t=None):
    rec = {"name": "aten::index_add_", "shapes": [[rows, 16], [], [k], [k, 16], []],
           "strides": [[16, 1], [], [1], [16, 1], []],
           "dtypes": ["float", "Scalar", "long int", "float", "Scalar"], "scalars": {"1": 0, "4": alpha}}  # fmt: skip
    rec["dur_us"] = t if t is not None else 2.0 + 0.03 * k * (3 if alpha != 1 else 1)
    return rec


def test_cache_roofline_recovers_per_index_cost_and_keys_alpha_apart():
    recs = [_index_add(4096, k, a) for k in (64, 500, 4000, 30_000, 100_000) for a in (1, -0.1)]
    model = RooflineTable(l2_bytes=1 << 20).fit(recs)
    for a in (1, -0.1):
        probe = _index_add(4096, 12_345, a)
        assert model.predict(probe) == pytest.approx(probe["dur_us"], rel=1e-2)
    assert F.index_count(recs[0]) == 64 and F.index_count(_ew(10)) == 0


def test_cache_roofline_fits_a_slower_bandwidth_beyond_l2():
    l2 = 1 << 20

    def rec(n):
        k = _ew(n)
        b = F.bytes_moved(k)
        k["dur_us"] = 3.0 + b / 20_000 + max(b - l2, 0) / 10_000
        return k

    recs = [rec(int(n)) for n in np.geomspace(100, 4e6, 14)]
    model = RooflineTable(l2_bytes=l2).fit(recs)
    assert gmae([model.predict(r) for r in recs], [r["dur_us"] for r in recs]) < 1e-3
    flat = RooflineTable().fit(recs)
    assert gmae([flat.predict(r) for r in recs], [r["dur_us"] for r in recs]) > 0.05
    again = KernelModels.from_json(KernelModels({"elementwise": model}).to_json())
    assert again.models["elementwise"].predict(recs[5]) == pytest.approx(model.predict(recs[5]))


def test_strided_operands_have_their_own_key():
    dense = {
        "name": "aten::copy_",
        "shapes": [[8, 4], [8, 4]],
        "strides": [[4, 1], [4, 1]],
        "dtypes": ["float", "float"],
    }
    strided = dict(dense, strides=[[4, 1], [1, 8]])  # copying a transposed view
    assert F.all_contiguous(dense) and not F.all_contiguous(strided)
    from perfmodel.kernel_models import operator_key

    assert operator_key(dense) != operator_key(strided)


def test_in_situ_factors_are_per_op_context_with_fallbacks():
    from perfmodel.graph import kernel_contexts

    op = {"name": "aten::binary_cross_entropy_with_logits",
          "kernels": [{"name": "aten::sub_"}, {"name": "aten::mul_"}, {"name": "aten::sub_"}]}  # fmt: skip
    assert kernel_contexts(op) == [f"{op['name']}#{i}" for i in (0, 0, 1)]  # rank per kernel name
    models = KernelModels({"elementwise": RooflineTable({"*": [10.0, 0.0]})})
    first, second = (dict(_ew(100), op=c) for c in ("loss#0", "loss#1"))
    models.calibrate_in_situ([[dict(first, dur_us=30.0), dict(second, dur_us=10.0)]])
    assert models.predict(first) == pytest.approx(30.0) and models.predict(second) == pytest.approx(
        10.0
    )
    # a context never seen in the fit traces falls back to the operator's factor (total 40 / 20)
    assert models.predict(dict(_ew(100), op="elsewhere#0")) == pytest.approx(20.0)
    assert models.predict(_ew(100)) == pytest.approx(20.0)


def test_in_situ_factors_weigh_every_fit_trace_alike():
    """Per key, the geometric mean of the traces' factors: one trace timed 4x slower than the
    model and one as fast give 2x, however many kernels each trace has."""
    models = KernelModels({"elementwise": RooflineTable({"*": [10.0, 0.0]})})
    k = dict(_ew(100), op="loss#0")
    slow_long = [dict(k, dur_us=40.0)] * 9  # nine kernels of one trace, 4x the model's 10 us
    fast_short = [dict(k, dur_us=10.0)]
    factors = models.calibrate_in_situ([slow_long, fast_short])
    assert factors[KernelModels.situ_keys(k)[0]] == pytest.approx(2.0)
    assert models.predict(k) == pytest.approx(20.0)  # a sum over both would say 37 us


def test_in_situ_factor_follows_the_kernel_size():
    """Small kernels of a context as fast as alone, large ones 2x slower: the factor at a size
    comes from the fit kernels of about that size, not from the context's total (which the large
    ones set); far from every fitted size it is the context's overall factor. GEMMs keep one
    factor per context."""
    models = KernelModels({"elementwise": RooflineTable({"*": [1.0, 1e-3]})})
    sizes = (100, 200, 400, 10**6, 2 * 10**6, 4 * 10**6)
    small, large = sizes[:3], sizes[3:]
    trace = [dict(_ew(n), op="relu#0", dur_us=models._predict(_ew(n)) * (1.0 if n in small else 2.0))
             for n in sizes]  # fmt: skip
    factors = models.calibrate_in_situ([trace, trace])
    overall = factors[KernelModels.situ_keys(trace[0])[0]]
    assert 1.9 < overall < 2.0  # one sum per trace: the large kernels hold nearly all the time
    # (the overall factor is a weak prior, SITU_PRIOR of a trace: a few % where points are few)
    for n in small:
        k = dict(_ew(n), op="relu#0")
        assert 1.0 < models.predict(k) / models._predict(k) < 1.12  # the one factor said 1.95
    for n in large:
        k = dict(_ew(n), op="relu#0")
        assert models.predict(k) / models._predict(k) == pytest.approx(2.0, rel=0.02)
    far = dict(_ew(30_000), op="relu#0")  # 5 doublings from both groups: the overall factor
    assert models.situ_factor(far, models._predict(far)) == pytest.approx(overall, rel=0.02)
    # the sized points survive the model file
    again = KernelModels.from_json(json.loads(json.dumps(models.to_json())))
    k = dict(_ew(200), op="relu#0")
    assert again.predict(k) == pytest.approx(models.predict(k), rel=1e-6)
    gemm = {"name": "aten::mm", "shapes": [[64, 32], [32, 16]], "strides": [[32, 1], [16, 1]],
            "dtypes": ["float", "float"]}  # fmt: skip
    assert KernelModels.situ_size(gemm, 5.0) is None


def test_in_situ_factors_may_exceed_four():
    """Tiny casts inside `aten::linear` measure 5-7x their isolated time in the fit traces."""
    models = KernelModels({"elementwise": RooflineTable({"*": [1.0, 1e-3]})})
    k = dict(_ew(4), op="linear#0")
    models.calibrate_in_situ([[dict(k, dur_us=models._predict(k) * 6.0)]])
    assert models.predict(k) / models._predict(k) == pytest.approx(6.0)


def test_outer_products_share_an_in_situ_factor_across_widths():
    """The logit layer's input gradient [B, 1] x [1, N] runs slower in a step than alone; a
    held-out width N has no key of its own but takes the factor of the outer products fitted in
    the same context, not the factor of every GEMM (which the big layers set)."""
    models = KernelModels({"gemm": GemmRoofline({"0": [1.0, 0.0, 1e-4, 1e-3]})})

    def mm(b, n, k, op="AddmmBackward0#0"):
        return {"name": "aten::mm", "shapes": [[b, k], [k, n]], "strides": [[k, 1], [n, 1]],
                "dtypes": ["float", "float"], "op": op}  # fmt: skip

    big, outer = mm(512, 256, 512), mm(512, 128, 1)
    models.calibrate_in_situ([[dict(big, dur_us=models._predict(big)),  # the big layer as alone
                               dict(outer, dur_us=models._predict(outer) * 2.5)]])  # fmt: skip
    held_out = mm(1024, 512, 1)  # another batch and width: strides [[1, 1], [512, 1]]
    assert KernelModels.situ_keys(held_out)[0] not in models.in_situ
    assert models.predict(held_out) / models._predict(held_out) == pytest.approx(2.5)
    # a general GEMM of a held-out width falls back to the GEMM-wide factor
    other = mm(1024, 512, 64)
    gemm_wide = models.in_situ["gemm|fp32"]
    assert 1.0 < gemm_wide < 2.5
    assert models.predict(other) / models._predict(other) == pytest.approx(gemm_wide)
    # so does an outer product in a context the fit traces never had
    elsewhere = mm(1024, 512, 1, op="MmBackward0#0")
    assert models.predict(elsewhere) / models._predict(elsewhere) == pytest.approx(gemm_wide)


def test_dense_optimizer_sweep_records_the_fused_step_with_its_parameter_count():
    import random

    from perfmodel import features as F
    from perfmodel.sweeps import _dense_optimizer_records

    rng = random.Random(3)
    seen = set()
    for _ in range(12):
        for r in _dense_optimizer_records(rng, reps=1):
            if r["name"].startswith("aten::_fused_"):
                seen.add(r["name"])
                n = r["ctx"]["dense_params"]
                assert 0 < n <= 3_000_000
                assert F.bytes_moved(r) == 12.0 * n  # read param and grad, write param
                assert r["dur_us"] > 0
    assert "aten::_fused_sgd_" in seen


def test_in_situ_factors_come_from_the_steady_traces_when_a_key_has_one():
    models = KernelModels({"elementwise": RooflineTable({"*": [10.0, 0.0]})})
    both, slow_only = dict(_ew(100), op="loss#0"), dict(_ew(100), op="loss#1")
    steady_trace = [dict(both, dur_us=10.0)]
    slow_trace = [dict(both, dur_us=18.0), dict(slow_only, dur_us=18.0)]
    factors = models.calibrate_in_situ(
        [steady_trace, slow_trace], slowdowns=[1.05, 1.8], steady=1.15
    )
    assert factors[KernelModels.situ_keys(both)[0]] == pytest.approx(1.0)  # the slow trace ignored
    assert factors[KernelModels.situ_keys(slow_only)[0]] == pytest.approx(1.8)  # nothing better
    without = models.calibrate_in_situ([steady_trace, slow_trace])  # no slowdowns: every trace
    assert without[KernelModels.situ_keys(both)[0]] == pytest.approx(1.8**0.5)


def test_embedding_sweep_records_forward_and_backward_over_distinct_batches(monkeypatch):
    """Each draw records fbgemm's forward and fused backward with its tables in the context; its
    reps cycle through 16 distinct index batches (as steps see new batches, not cached ones) and
    run on the thread count the sweep was given (the synthetic data's numba layer resets it)."""
    import random

    import torch

    from perfmodel import sweeps

    seen, threads_seen = [], []
    real = sweeps.profile_kernels

    def spy(step, reps, ctx):
        from embeddings import FusedEmbeddingBagCollection

        calls = []
        orig = FusedEmbeddingBagCollection.forward
        monkeypatch.setattr(FusedEmbeddingBagCollection, "forward",
                            lambda self, kjt: calls.append(kjt.values().data_ptr()) or orig(self, kjt))  # fmt: skip
        threads_seen.append(torch.get_num_threads())
        out = real(step, reps, ctx)
        monkeypatch.setattr(FusedEmbeddingBagCollection, "forward", orig)
        seen.append(len(set(calls)))
        return out

    monkeypatch.setattr(sweeps, "profile_kernels", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recs = sweeps.bench_embedding(random.Random(3), 2, 20)
    finally:
        torch.set_num_threads(before)
    names = {r["name"] for r in recs}
    assert "fbgemm::split_embedding_codegen_forward_cpu" in names
    assert any(n.startswith("fbgemm::split_embedding_backward_codegen_") for n in names)
    fwd = [r for r in recs if r["name"] == "fbgemm::split_embedding_codegen_forward_cpu"]
    assert len(fwd) == 2 and all(len(r["ctx"]["table_sizes"]) in (4, 8, 16, 26) for r in fwd)
    assert seen == [16, 16]  # a warm call + 20 reps over 16 distinct batches each
    assert threads_seen == [1, 1]


@pytest.mark.parametrize("fan_in", [13, 64, 67])
def test_gemm_sweep_runs_a_layer_in_the_layouts_of_a_training_step(fan_in):
    """The sweep's GEMMs of an MLP layer have the shapes and strides autograd gives the
    trainer's layer (`nn.Linear`, `NarrowInputLinear` for narrow inputs, `PaddedInputLinear` for
    widths that are not a multiple of 8): the weight
    gradient of a transposed weight view is g^T x, not x^T g."""
    import torch

    from dlrm.models.dlrm import linear_layer
    from perfmodel.sweeps import linear_gemms, profile_kernels

    b, fo = 32, 24
    layer = linear_layer(fan_in, fo)
    x = torch.randn(b, fan_in, requires_grad=True)
    g = torch.randn(b, fo)
    recs = profile_kernels(lambda: layer(x).backward(g), reps=1)

    def operands(name, shapes, strides):  # the two matrices (addmm's first operand is the bias)
        i = 1 if name == "aten::addmm" else 0
        return (name, [list(x) for x in shapes[i : i + 2]], [list(x) for x in strides[i : i + 2]])

    step = sorted(
        operands(r["name"], r["shapes"], r["strides"])
        for r in recs
        if r["name"] in ("aten::addmm", "aten::mm")
    )
    sweep = sorted(
        operands(name, [t.shape for t in args], [t.stride() for t in args])
        for name, args, _ in linear_gemms(b, fan_in, fo, torch.float32)
    )
    assert len(step) == 3 and step == sweep


def test_profile_kernels_matches_kernels_across_reps_that_ran_the_same_sequence():
    """A rep with a one-off kernel (here an extra fill_ in the first rep, as a cached value
    computed on first use) is left out instead of shifting every later kernel's durations."""
    import torch

    from perfmodel.sweeps import profile_kernels

    a, b, x = torch.randn(64, 64), torch.randn(64, 64), torch.zeros(8)
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 2:  # the first profiled rep (the first call warms up)
            x.fill_(1.0)
        torch.mm(a, b)
        torch.sigmoid(a)

    recs = profile_kernels(step, reps=5)
    assert [r["name"] for r in recs] == ["aten::mm", "aten::sigmoid"]
    assert recs[0]["shapes"][:2] == [[64, 64], [64, 64]]


def test_device_kernels_spill_beyond_the_devices_l2():
    """On a CUDA machine the roofline's cache term of a device kernel uses the device's L2, a
    host kernel's the CPU's; both survive the model file."""
    model = RooflineTable(l2_bytes=1 << 20, device_l2_bytes=50 << 20)
    host = _ew(1 << 20)  # 8 MiB moved: beyond the CPU's 1 MiB L2, inside the device's 50 MiB
    device = dict(host, stream="cuda:0")
    assert model.terms(host)[2] == F.bytes_moved(host) - (1 << 20) > 0
    assert model.terms(device)[2] == 0.0
    again = KernelModels.from_json(
        {"models": {"elementwise": model.to_json()}, "choice": {}, "errors": {}, "in_situ": {}}
    ).models["elementwise"]
    assert again.terms(device) == model.terms(device) and again.terms(host) == model.terms(host)


def test_in_situ_factor_follows_the_steps_working_set():
    """The same kernels run at their isolated speed inside a step that moves 10 MB and 2x slower
    inside one that moves 200 MB: a kernel reads the factor of the fit steps nearest its own
    step's working set (the nearest ones beyond the fitted range); embedding lookups, whose
    model has its own cache term, and calls without a step keep the step-free factor."""
    models = KernelModels({"elementwise": RooflineTable({"*": [1.0, 1e-3]}),
                           "gemm": GemmRoofline({"0": [1.0, 0.0, 1e-4, 1e-3]})})  # fmt: skip
    mm = {"name": "aten::mm", "shapes": [[256, 64], [64, 32]], "strides": [[64, 1], [32, 1]],
          "dtypes": ["float", "float"], "op": "AddmmBackward0#0"}  # fmt: skip
    kernels = [dict(_ew(n), op="relu#0") for n in (1000, 50_000)] + [mm]

    def trace(step_bytes, factor):
        return [dict(k, step_bytes=step_bytes, dur_us=models._predict(k) * factor) for k in kernels]

    models.calibrate_in_situ([trace(10e6, 1.0), trace(200e6, 2.0)])
    for k in kernels:
        raw = models._predict(k)
        # (the key's overall factor, sqrt 2, is a weak prior: it pulls a few % toward itself)
        assert models.predict(k, 10e6) / raw == pytest.approx(1.0, rel=0.07)
        assert models.predict(k, 200e6) / raw == pytest.approx(2.0, rel=0.07)
        assert models.predict(k, 2e6) / raw == pytest.approx(1.0, rel=0.07)  # below the range
        assert models.predict(k, 2e9) / raw == pytest.approx(2.0, rel=0.07)  # above it
        between = models.predict(k, math.sqrt(10e6 * 200e6)) / raw  # equally far from both
        assert between == pytest.approx(math.sqrt(2.0), rel=0.02)
        # the record's own step_bytes when no step is given; the step-free factor without either
        assert models.predict(dict(k, step_bytes=10e6)) == pytest.approx(models.predict(k, 10e6))
        assert models.predict(k) / raw == pytest.approx(between, rel=0.02)
    # the points keep their step through the model file
    again = KernelModels.from_json(json.loads(json.dumps(models.to_json())))
    for k in kernels:
        assert again.predict(k, 10e6) == pytest.approx(models.predict(k, 10e6), rel=1e-6)


def test_embedding_in_situ_factors_do_not_depend_on_the_step():
    name = "fbgemm::split_embedding_codegen_forward_unweighted_cpu"
    models = KernelModels({"embedding_fwd": EmbeddingModel({name: [5.0, 1e-3, 0, 0, 0, 0]}, 2e6)})
    k = {"name": name, "op": "FusedLookup#0", "shapes": [], "dtypes": ["float"],
         "ctx": {"batch_size": 64, "table_sizes": [1000] * 4}}  # fmt: skip
    assert F.op_type(name) == "embedding_fwd"
    raw = models._predict(k)
    models.calibrate_in_situ([[dict(k, step_bytes=10e6, dur_us=raw)],
                              [dict(k, step_bytes=200e6, dur_us=2 * raw)]])  # fmt: skip
    assert models.predict(k, 10e6) == pytest.approx(models.predict(k, 200e6))
    assert models.predict(k, 10e6) / raw == pytest.approx(math.sqrt(2.0), rel=0.02)


def test_model_files_written_before_step_points_still_predict():
    """In-situ points of three columns (no step) read as step-free."""
    models = KernelModels({"elementwise": RooflineTable({"*": [1.0, 1e-3]})})
    k = dict(_ew(1000), op="relu#0")
    raw = models._predict(k)
    models.calibrate_in_situ([[dict(k, dur_us=1.5 * raw)]])
    doc = models.to_json()
    doc["in_situ_points"] = {
        key: [pt[:3] for pt in pts] for key, pts in doc["in_situ_points"].items()
    }
    old = KernelModels.from_json(json.loads(json.dumps(doc)))
    assert old.predict(k, 10e6) / raw == pytest.approx(1.5, rel=1e-6)


def test_a_kernel_whose_model_overflows_is_left_out_of_the_in_situ_factors():
    """A model extrapolated far past its sweep's shapes (a few shapes swept) may overflow to
    inf: that kernel says nothing of its context's factor, and the fit goes on."""
    models = KernelModels({"elementwise": RooflineTable({"*": [10.0, 0.0]})})
    k, huge = dict(_ew(100), op="loss#0", dur_us=30.0), dict(_ew(200), op="loss#0", dur_us=5.0)
    plain = models._predict
    models._predict = lambda r: math.inf if r is huge else plain(r)
    factors = models.calibrate_in_situ([[k, huge]])
    assert factors[KernelModels.situ_keys(k)[0]] == pytest.approx(3.0)
