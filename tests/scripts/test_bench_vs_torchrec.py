"""scripts/bench_vs_torchrec.py: the peer (torchrec's DLRM / DLRM_DCN under
DistributedModelParallel, sparse optimizer in backward) and our trainer compute the same thing,
which is what makes the side by side fair; and the JSON's shape at quick sizes. No timings are
asserted."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from dlrm import Trainer

_SPEC = importlib.util.spec_from_file_location(
    "bench_vs_torchrec", Path(__file__).resolve().parents[2] / "scripts" / "bench_vs_torchrec.py"
)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up while it loads
_SPEC.loader.exec_module(bench)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize(
    "case, sizes",
    [
        (bench.DOT, bench.table_sizes(bench.DOT, 0.0002, 0)),  # SGD, one id a feature
        (bench.DCN, bench.table_sizes(bench.DCN, 1.0, 50)),  # Adagrad, MLPerf's multi-hot bags
    ],
    ids=["dot-sgd", "dcn-adagrad"],
)
def test_one_fp32_step_gives_the_same_loss_rows_and_weights(case, sizes, tmp_path):
    cfg = bench.train_config(case, sizes, 16, "fp32", str(tmp_path), compile=False, steps=4)
    trainer = Trainer(cfg, checkpoints=False)
    dmp = bench.torchrec_model(case, sizes)
    bench.copy_weights(trainer.model, dmp, case)
    before = [mine.clone() for mine, _ in bench.weight_pairs(trainer.model, dmp, case)]
    batch = next(trainer.data.train.batches(0))
    peer_loss = bench.PeerStep(dmp, bench.dense_optimizer(case, dmp), [batch], bf16=False).step(
        batch
    )
    ours_loss = trainer.pipeline.progress(iter([batch])).loss
    assert float(ours_loss.detach()) == pytest.approx(float(peer_loss.detach()), rel=1e-6)
    pairs = bench.weight_pairs(trainer.model, dmp, case)
    moved = 0
    for old, (mine, theirs) in zip(before, pairs):
        torch.testing.assert_close(mine, theirs.detach(), rtol=1e-5, atol=1e-6)
        moved += int(not torch.equal(old, mine))
    # every dense tensor and every table stepped: the comparison is of updated values
    assert moved == len(pairs)


def test_the_top_layer_columns_follow_torchrecs_order_of_pairs():
    # torchrec: pairs (i, j), i < j, row-major; ours: (i, j), i > j, row-major
    assert bench.dot_columns(3).tolist() == [0, 1, 2]  # (0,1) (0,2) (1,2) <- (1,0) (2,0) (2,1)
    assert bench.dot_columns(4).tolist() == [0, 1, 3, 2, 4, 5]


def test_the_json_at_quick_sizes_has_every_case_batch_and_ratio(capsys, long_training):
    variants = ["torchrec_fp32", "ours_fp32_eager"]
    result = bench.main(["--table-scale", "0.001", "--dcn-rows", "1000", "--seconds", "0.01",
                         "--rounds", "2", "--batch-sizes", "8", "--variants", ",".join(variants)])  # fmt: skip
    assert set(result["cases"]) == {"dlrm_dot", "dlrm_dcn"}
    assert result["cases"]["dlrm_dcn"]["ids_per_sample"] == 214
    assert set(result["versions"]) == {"torch", "fbgemm_gpu", "torchrec"}
    for case in result["cases"].values():
        row = case["batches"]["8"]
        for v in variants:
            assert row[f"{v}_samples_per_s"] > 0
            assert len(row["all_rounds_samples_per_s"][v]) == 2
        assert row["ours_fp32_eager_vs_torchrec"] > 0
        assert "ours_bf16_eager_vs_torchrec" not in row  # not measured, not reported
    assert capsys.readouterr().out.startswith("{")


def test_an_unknown_variant_is_one_line_and_exit_code_2(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--variants", "ours_fp16"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "bench_vs_torchrec.py: error: --variants: unknown ours_fp16; expected some of "
        + ", ".join(bench.VARIANTS)
    )
