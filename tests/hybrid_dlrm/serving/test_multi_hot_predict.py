"""A model trained on multi-hot bags, exported and served: the artifact's predictions on bags of
many ids (some empty) are what the quantized model computes, bag by bag, in memory, from the SSD
tier and from per-sample id lists; a fp32 export predicts what the trained model does."""

import pytest
import torch

from dlrm import TrainConfig, Trainer
from dlrm.models.quantized import from_float_state
from embeddings.quantized import dequantize_rows
from hybrid_dlrm.serving import Predictor
from hybrid_dlrm.serving.artifact import load as load_artifact
from hybrid_dlrm.serving.inference_data import load_source
from hybrid_dlrm.serving.predictor import bags_to_kjt
from hybrid_dlrm.serving.quantize import main as quantize
from tests.multi_hot_source import multi_hot_splits

TINY = dict(
    arch_embedding_size=(60, 40, 500, 7), arch_sparse_feature_size=4, arch_mlp_bot=(13, 16, 4),
    arch_mlp_top=(16, 1), mini_batch_size=32, data_size=32 * 40, test_data_size=256,
    learning_rate=0.1, progress=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, long_training):  # a tiny epoch and more
    d = tmp_path_factory.mktemp("multi_hot_quant")
    cfg = TrainConfig(**TINY, arch_interaction_op="dcn", dcn_num_layers=2, dcn_low_rank_dim=3,
                      out_dir=str(d / "run"))  # fmt: skip
    trainer = Trainer(cfg, data=multi_hot_splits(batch_size=32, steps=40))
    trainer.fit()
    for precision in ("int8", "fp32"):
        assert quantize([str(d / "run"), "--out", str(d / precision), "--emb-precision",
                         precision, "--batch-size", "64", "--batches", "2"]) == 0  # fmt: skip
    batches = [multi_hot_splits(batch_size=32, steps=2).test.batch(0, i) for i in range(2)]
    return d, trainer, batches


def pooled_bag_by_bag(rows: list[torch.Tensor], precisions, dim: int, kjt) -> torch.Tensor:
    """Sum of each bag's dequantised rows (zeros for an empty bag), spelled out per bag."""
    T, B = len(kjt.keys()), kjt.stride()
    lengths, values = kjt.lengths().tolist(), kjt.values()
    out, pos = torch.zeros(B, T * dim), 0
    for t in range(T):
        for i in range(B):
            n = lengths[t * B + i]
            if n:
                ids = values[pos : pos + n]
                out[i, t * dim : (t + 1) * dim] = dequantize_rows(rows[t][ids], precisions[t], dim).sum(0)  # fmt: skip
            pos += n
    return out


def test_the_int8_artifact_predicts_what_the_quantized_model_computes_on_bags(run, tmp_path):
    d, _, batches = run
    source = load_source(d / "run")
    model, _ = from_float_state(source.arch, source.tables, source.state, ["int8"] * 4, "fp32")
    artifact = load_artifact(d / "int8")
    predictors = [Predictor.load(d / "int8"), Predictor.load(d / "int8", backend="torch"),
                  Predictor.load(d / "int8", scm_dir=tmp_path / "scm", scm_cache=20 * 12,
                                 scm_io="buffered")]  # fmt: skip
    for batch in batches:
        kjt = batch.sparse_features
        assert int(kjt.lengths().max()) > 1 and int(kjt.lengths().min()) == 0
        expected = torch.sigmoid(model(batch.dense_features, kjt))
        for p in predictors:
            assert torch.equal(p.predict(batch), expected)
        # the pooling is a sum over each bag's rows: within float rounding of the bag-by-bag
        # sum (fbgemm's kernel adds a bag's rows in its own order)
        pooled = pooled_bag_by_bag(artifact.rows, artifact.precisions, 4, kjt)
        torch.testing.assert_close(
            predictors[0].model.embeddings(kjt).values(), pooled, rtol=0, atol=1e-6
        )


def test_a_fp32_export_predicts_what_the_trained_model_does_on_bags(run):
    d, trainer, batches = run
    predictor = Predictor.load(d / "fp32")
    model = trainer.model.eval()
    for batch in batches:
        with torch.no_grad():
            expected = torch.sigmoid(model(batch.dense_features, batch.sparse_features).float())
        torch.testing.assert_close(predictor.predict(batch), expected.view(-1), rtol=0, atol=1e-6)


def test_per_sample_id_lists_are_the_multi_hot_request_and_one_hot_rows_still_score(run):
    d, _, batches = run
    predictor = Predictor.load(d / "int8")
    batch = batches[0]
    kjt = batch.sparse_features
    T, B = len(kjt.keys()), kjt.stride()
    per_bag = [b.tolist() for b in torch.split(kjt.values(), kjt.lengths().tolist())]
    bags = [[per_bag[t * B + i] for t in range(T)] for i in range(B)]
    assert bags_to_kjt(bags, predictor.feature_names).values().tolist() == kjt.values().tolist()
    assert torch.equal(predictor.predict_bags(batch.dense_features, bags), predictor.predict(batch))
    # one id per feature: the rows form and the bags form agree
    ids = torch.tensor([[max(1, i + t) % 7 for t in range(T)] for i in range(B)])
    one_hot = [[[int(v)] for v in row] for row in ids]
    assert torch.equal(
        predictor.predict_rows(batch.dense_features, ids),
        predictor.predict_bags(batch.dense_features, one_hot),
    )
    with pytest.raises(ValueError, match="sample 1 has 3 features, expected 4"):
        predictor.predict_bags(batch.dense_features[:2], [bags[0], bags[1][:3]])
    bad = [list(b) for b in bags[:2]]
    bad[1] = [[0], [0], [0, 600], []]
    with pytest.raises(ValueError, match="id 600 of feature cat_2 is outside table"):
        predictor.predict_bags(batch.dense_features[:2], bad)
