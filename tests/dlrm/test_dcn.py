"""`--arch-interaction-op dcn` (DCNv2's low-rank cross layers): given torchrec DLRM_DCN's weights,
our DLRM computes what torchrec's does (forward and gradients), also on multi-hot bags; the
settings, the MLPerf reference configuration, checkpoints that refuse the other interaction,
the compiled path and TBSM's step encoder."""

from __future__ import annotations

import pytest
import torch
from torchrec.models.dlrm import DLRM_DCN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import MLPERF_DCNV2_TABLES, TrainConfig
from dlrm.errors import ArchError, CheckpointError, ConfigError
from dlrm.models.dlrm import DLRM, DLRMArch
from dlrm.models.tbsm import TBSM, TBSMArch
from dlrm.trainer import Trainer
from embeddings import FusedEmbeddingBagCollection, tables_for_features
from tests.dlrm.conftest import tiny

SIZES = (20, 30, 5)
DIM, LAYERS, RANK = 8, 2, 4


def torchrec_model(seed: int = 0) -> DLRM_DCN:
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t_cat_{i}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"cat_{i}"]
            )
            for i, n in enumerate(SIZES)
        ]  # fmt: skip
    )
    model = DLRM_DCN(ebc, 3, [16, DIM], [12, 1], dcn_num_layers=LAYERS, dcn_low_rank_dim=RANK)
    with torch.no_grad():  # torchrec's cross layers start with zero bias: make them count
        for b in model.inter_arch.crossnet.bias:
            b.normal_()
    return model


def ours_from(ref: DLRM_DCN) -> DLRM:
    """Our DLRM with `ref`'s weights, copied by role (linear layers in order, cross kernels by
    name, tables by feature)."""
    arch = DLRMArch(3, DIM, len(SIZES), (3, 16, DIM), (12, 1), "dcn",
                    dcn_num_layers=LAYERS, dcn_low_rank_dim=RANK)  # fmt: skip
    emb = FusedEmbeddingBagCollection(tables_for_features(list(SIZES), DIM), backend="torch")
    model = DLRM(arch, emb, seed=1)

    def linears(m):
        return [x for x in m.modules() if isinstance(x, torch.nn.Linear)]

    with torch.no_grad():
        pairs = [*zip(linears(model.bottom_mlp), linears(ref.dense_arch)),
                 *zip(linears(model.top_mlp), linears(ref.over_arch))]  # fmt: skip
        assert len(pairs) == 4
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
        theirs = dict(ref.inter_arch.crossnet.named_parameters())
        mine = dict(model.interaction.crossnet.named_parameters())
        assert mine.keys() == theirs.keys()  # W_kernels.0, V_kernels.0, bias.0, ...
        for name, p in mine.items():
            p.copy_(theirs[name])
        bags = ref.sparse_arch.embedding_bag_collection.embedding_bags
        for i, table in enumerate(emb.table_weights()):
            table.copy_(bags[f"t_cat_{i}"].weight)
    return model


def multi_hot_batch(batch: int = 6, seed: int = 0):
    """Bags of 0 to 3 ids per feature: the interaction consumes pooled embeddings, never ids."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(SIZES), batch), generator=g)
    values = torch.cat(
        [torch.randint(0, n, (int(lengths[i].sum()),), generator=g) for i, n in enumerate(SIZES)]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"cat_{i}" for i in range(len(SIZES))], values=values, lengths=lengths.flatten()
    )
    return torch.randn(batch, 3, generator=g), kjt


def test_forward_equals_torchrec_dlrm_dcn_on_multi_hot_bags():
    ref = torchrec_model()
    ours = ours_from(ref)
    dense, kjt = multi_hot_batch()
    torch.testing.assert_close(ours(dense, kjt), ref(dense, kjt).squeeze(1), rtol=1e-6, atol=1e-6)


def _dense_grads(model_forward, params, dense, pooled):
    pooled = pooled.detach().requires_grad_()
    out = model_forward(dense, pooled)
    out.square().sum().backward()
    return out.detach(), pooled.grad, [p.grad.clone() for p in params]


def test_gradients_equal_torchrec_dlrm_dcn_fp32():
    ref = torchrec_model()
    ours = ours_from(ref)
    dense, kjt = multi_hot_batch(batch=32, seed=1)
    pooled = ref.sparse_arch(kjt).detach()  # [B, F, D]

    def ref_forward(d, p):
        x = ref.inter_arch(ref.dense_arch(d), p.view(-1, len(SIZES), DIM))
        return ref.over_arch(x).squeeze(1)

    ref_params = [*ref.dense_arch.parameters(), *ref.inter_arch.parameters(),
                  *ref.over_arch.parameters()]  # fmt: skip
    want = _dense_grads(ref_forward, ref_params, dense, pooled.flatten(1))
    got = _dense_grads(ours.dense_forward, ours.dense_parameters(), dense, pooled.flatten(1))
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)  # dL/d(pooled)
    assert len(got[2]) == len(want[2]) == 8 + 3 * LAYERS  # dense_parameters has the cross layers
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


# bf16 under autocast: both models run the same bf16 GEMMs on the same operands; the tolerance
# is two bf16 ulps of the output (2^-7 relative), for the order of the GEMMs' accumulations
BF16_RTOL = 2**-6


def test_bf16_autocast_equals_torchrec_dlrm_dcn_within_bf16_tolerance():
    ref = torchrec_model(seed=2)
    ours = ours_from(ref)
    dense, kjt = multi_hot_batch(batch=32, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(dense, kjt).float().detach()
        want = ref(dense, kjt).squeeze(1).float().detach()
    scale = want.abs().max()
    torch.testing.assert_close(got, want, rtol=BF16_RTOL, atol=BF16_RTOL * float(scale))


def test_arch_widths_and_one_line_errors():
    arch = DLRMArch(13, 128, 26, (13, 512, 256, 128), (1024, 1024, 512, 256, 1), "dcn")
    assert arch.top_input == 27 * 128 and (arch.dcn_num_layers, arch.dcn_low_rank_dim) == (3, 512)
    with pytest.raises(ArchError, match=r"^dcn_low_rank_dim: expected a positive integer, got 0$"):
        DLRMArch(3, 4, 2, (3, 4), (1,), "dcn", dcn_low_rank_dim=0)
    with pytest.raises(ConfigError, match=r"^--dcn-num-layers: "):
        TrainConfig(arch_interaction_op="dcn", dcn_num_layers=0)


TERABYTE = dict(data_set="terabyte", processed_data_file="terabyte_dir")  # not opened here


def test_terabyte_dcn_takes_mlperf_dcnv2_without_other_arch_flags():
    cfg = TrainConfig(**TERABYTE, arch_interaction_op="dcn")
    assert cfg.arch_sparse_feature_size == 128
    assert cfg.arch_mlp_bot == (13, 512, 256, 128)
    assert cfg.arch_mlp_top == (1024, 1024, 512, 256, 1)
    assert cfg.arch_embedding_size == MLPERF_DCNV2_TABLES and len(MLPERF_DCNV2_TABLES) == 26
    assert sum(MLPERF_DCNV2_TABLES) * 128 * 4 == pytest.approx(104e9, rel=0.02)  # the issue's
    assert (cfg.dcn_num_layers, cfg.dcn_low_rank_dim, cfg.max_ind_range) == (3, 512, 40_000_000)
    assert "--arch-mlp-top 1024-1024-512-256-1" in cfg.describe_reference_defaults()
    # the dot recipe is unchanged, and an architecture flag given keeps the data set's own entry
    assert TrainConfig(**TERABYTE).arch_mlp_bot == (13, 512, 256, 64)
    given = TrainConfig(**TERABYTE, arch_interaction_op="dcn", arch_mlp_top=(64, 1))
    assert given.arch_sparse_feature_size == 64 and given.arch_embedding_size is None


def test_arch_signature_has_the_dcn_fields_only_for_dcn():
    dot, dcn = TrainConfig(), TrainConfig(arch_interaction_op="dcn")
    assert "dcn_num_layers" not in dot.arch_signature()  # dot checkpoints load as before
    assert dcn.arch_signature()["dcn_low_rank_dim"] == 512
    other = TrainConfig(arch_interaction_op="dcn", dcn_low_rank_dim=64)
    assert other.arch_signature() != dcn.arch_signature()


DCN = dict(arch_interaction_op="dcn", dcn_num_layers=2, dcn_low_rank_dim=3, data_size=64 * 6)


@pytest.fixture(scope="module")
def dcn_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcn")
    trainer = Trainer(tiny(d, out_dir=str(d / "dcn"), save_model=str(d / "model.pt"), **DCN))
    trainer.fit()
    return d, trainer


def test_checkpoints_refuse_the_other_interaction(dcn_run, tmp_path):
    (tmp_path / "dcn").symlink_to(dcn_run[0] / "dcn")
    Trainer(tiny(tmp_path, out_dir=str(tmp_path / "dot"), data_size=64 * 6)).fit()
    for run, other in (("dcn", dict(data_size=64 * 6)), ("dot", DCN),
                       ("dcn", {**DCN, "dcn_low_rank_dim": 4})):  # fmt: skip
        with pytest.raises(CheckpointError, match="written for a different model"):
            Trainer(
                tiny(tmp_path, resume=str(tmp_path / run), out_dir=str(tmp_path / "x"), **other)
            )


def test_dcn_trains_and_the_compiled_bf16_step_tracks_eager(tmp_path):
    """The written-out step (dlrm/pipelines/dense_step.py) is dot/cat only: a DCN model compiles its
    forward and trains through autograd, and tracks the eager run."""
    from dlrm.pipelines import dense_step

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kw = dict(DCN, precision="bf16", num_batches=4, test_data_size=512)
        eager = Trainer(tiny(tmp_path, out_dir=str(tmp_path / "e"), compile=False, **kw))
        compiled = Trainer(tiny(tmp_path, out_dir=str(tmp_path / "c"), compile=True, **kw))
        assert not dense_step.supports(compiled.model)
        a, b = eager.fit(), compiled.fit()
    finally:
        torch.set_num_threads(threads)
    assert b["compiled"] and not a["compiled"]
    assert b["test_auc"] == pytest.approx(a["test_auc"], abs=2e-3)
    for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters()):
        if "crossnet" in name:
            assert not torch.equal(p, torch.zeros_like(p)), name  # the cross layers trained
        torch.testing.assert_close(q, p, rtol=2e-2, atol=2e-3, msg=name)


def test_tbsm_step_encoder_takes_the_dcn_interaction():
    arch = TBSMArch(1, 4, 2, (1, 4), (5, 3), ts_length=3, interaction="dcn",
                    dcn_num_layers=2, dcn_low_rank_dim=2)  # fmt: skip
    emb = FusedEmbeddingBagCollection(tables_for_features([10, 7], 4), backend="torch")
    model = TBSM(arch, emb)
    assert model.step.top_mlp[0].in_features == 3 * 4
    assert any("crossnet" in n for n, _ in model.named_parameters())
    out = model.dense_forward(torch.randn(2 * 4, 1), torch.randn(2 * 4, 8))
    assert out.shape == (2,) and torch.isfinite(out).all()


def test_quantized_export_carries_the_cross_layers(dcn_run):
    """hybrid_dlrm.serving.quantize exports a dcn model: fp32 predicts what the trained model does, bf16 MLPs
    keep the cross layers in float32 (they are not linear layers)."""
    from hybrid_dlrm.serving import Predictor
    from hybrid_dlrm.serving.quantize import main

    d, trainer = dcn_run
    model = trainer.model.eval()
    dense, kjt = _test_batch(trainer)
    with torch.no_grad():
        expected = torch.sigmoid(model(dense, kjt))
    for prec, tol in (("fp32", 1e-6), ("bf16", 2e-2)):
        out = d / prec
        argv = [str(d / "model.pt"), "--out", str(out), "--emb-precision", "fp32",
                "--mlp-precision", prec, "--batch-size", "256", "--batches", "2"]  # fmt: skip
        assert main(argv) == 0
        got = Predictor.load(out).predict((dense, kjt))
        torch.testing.assert_close(got, expected, rtol=0, atol=tol)


def _test_batch(trainer):
    batch = next(iter(trainer.data.test.batches()))
    return batch.dense_features, batch.sparse_features


def test_bench_terabyte_mlperf_dcnv2_recipe(tmp_path):
    """The reference configuration (on the SSD tier where memory is short of the tables) and
    the scaled-down variant, as dry runs."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_terabyte.sh"
    (tmp_path / "day_0").write_text("")

    def flags(*args, **env):
        out = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                             env={**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1", **env},
                             check=True).stdout  # fmt: skip
        words = shlex.split(out)
        return {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--")}

    want = {"--arch-sparse-feature-size": "128", "--arch-mlp-bot": "13-512-256-128",
            "--arch-mlp-top": "1024-1024-512-256-1", "--arch-interaction-op": "dcn",
            "--dcn-num-layers": "3", "--dcn-low-rank-dim": "512", "--optimizer": "adagrad"}  # fmt: skip
    small_machine = flags("--mlperf-dcnv2", str(tmp_path), MEM_KB=str(24 << 20))  # 24 GB
    assert want.items() <= small_machine.items()
    assert small_machine["--max-ind-range"] == "40000000"
    assert small_machine["--mlperf-auc-threshold"] == "0.80275"
    assert small_machine["--placement"] == "tiered" and "--scm-dir" in small_machine
    assert "--contiguous-ids" in small_machine  # MLPerf's renumbered tables: 104 GB, not 532
    big_machine = flags("--mlperf-dcnv2", str(tmp_path), MEM_KB=str(1 << 30))  # 1 TB
    assert "--placement" not in big_machine
    laptop = flags("--mlperf-dcnv2-small", "--num-batches", "3")
    assert want.items() <= laptop.items() and laptop["--data-set"] == "synthetic"
    assert laptop["--num-batches"] == "3"  # extra flags come last
