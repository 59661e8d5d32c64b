"""The model contract (dlrm/models/contract.py) and the kinds' registry (dlrm/models/kinds.py):
a model kind defined here, and registered only while these tests run, trains through the Trainer,
resumes bit-identically, exports through `hybrid_dlrm.serving.quantize` and is scored by the
Predictor, with no edit anywhere else; and no product module asks a model's kind by its name."""

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from dlrm import TrainConfig, Trainer
from dlrm.config import ConfigError
from dlrm.errors import CheckpointError
from dlrm.models import RecModel, make_mlp
from dlrm.models.contract import ModelArch
from dlrm.models.kinds import ModelKind, kind_names, kind_of, model_kind, register, unregister
from dlrm.models.quantized import from_float_state
from dlrm.models.tbsm import TBSMArch
from embeddings.config import tables_for_features
from embeddings.fused import FusedEmbeddingBagCollection
from hybrid_dlrm.serving import Predictor
from hybrid_dlrm.serving.inference_data import data_source, load_source, take_batches
from hybrid_dlrm.serving.quantize import main as quantize
from tests.dlrm.conftest import assert_resumed_exactly

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class ToyArch:
    num_dense: int
    embedding_dim: int
    num_sparse: int
    hidden: int


class Toy(nn.Module):
    """One MLP over the dense features and every pooled embedding side by side."""

    def __init__(self, arch: ToyArch, embeddings: nn.Module, seed: int = 0) -> None:
        super().__init__()
        self.arch = arch
        self.embeddings = embeddings
        width = arch.num_dense + arch.num_sparse * arch.embedding_dim
        gen = torch.Generator().manual_seed(seed)
        self.mlp = make_mlp((width, arch.hidden, 1), final_activation=False, generator=gen)

    def dense_parameters(self) -> list[nn.Parameter]:
        return list(self.mlp.parameters())

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        return self.dense_forward(dense, self.embeddings(sparse).values())

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([dense, pooled.to(dense.dtype)], dim=1)).squeeze(1)


TOY = ModelKind(
    name="toy",
    title="Toy",
    arch_class=ToyArch,
    model_class=Toy,
    arch_from_settings=lambda cfg, num_dense, num_sparse: ToyArch(
        num_dense, cfg.arch.sparse_feature_size, num_sparse, cfg.arch.mlp_top[0]
    ),
    arch_from_signature=lambda sig, num_sparse: ToyArch(
        sig["arch_mlp_bot"][0], sig["arch_sparse_feature_size"], num_sparse, sig["arch_mlp_top"][0]
    ),
)

TINY = dict(
    model="toy", arch_embedding_size=(60, 40, 500, 7), arch_sparse_feature_size=4,
    arch_mlp_bot=(13, 16, 4), arch_mlp_top=(16, 1), mini_batch_size=64, test_data_size=1024,
    learning_rate=0.1, print_freq=10, progress=False,
)  # fmt: skip


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    unregister(TOY.name)


def test_each_kind_meets_the_contract_and_keeps_its_tables_at_its_prefix(toy, tmp_path):
    models = [
        Trainer(TrainConfig(**{**TINY, "model": name}, out_dir=str(tmp_path / name))).model
        for name in ("dlrm", "toy")
    ]
    tables = tables_for_features([10, 20, 30], 4)
    arch = TBSMArch(1, 4, 3, (1, 4), (6, 6), ts_length=3)
    models.append(model_kind("tbsm").model_class(arch, FusedEmbeddingBagCollection(tables)))
    for model in models:
        kind = kind_of(model.arch)
        assert isinstance(model, RecModel) and isinstance(model.arch, ModelArch), kind.name
        assert model.get_submodule(kind.embedding_prefix[:-1]) is model.embeddings, kind.name
    assert [kind_of(m.arch).name for m in models] == ["dlrm", "toy", "tbsm"]
    assert isinstance(models[1], Toy)
    cfg = TrainConfig(model="tbsm", data_set="taobao", processed_data_file="x", ts_length=5)
    assert model_kind("tbsm").rows_per_sample(cfg) == 6


@pytest.mark.usefixtures("long_training")
def test_a_registered_kind_trains_and_resumes_bit_identically(toy, tmp_path):
    run = dict(TINY, test_freq=10, nepochs=2, data_size=64 * 15, optimizer="rowwise_adagrad")
    full = Trainer(TrainConfig(**run, keep_checkpoints=10, out_dir=str(tmp_path / "full")))
    assert isinstance(full.model, Toy)
    full_summary = full.fit()
    cut = tmp_path / "cut"  # "interrupted" after step 20 (mid second epoch)
    (cut / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "full" / "checkpoints" / "step_000000020.pt", cut / "checkpoints")
    resumed = Trainer(TrainConfig(**run, out_dir=str(cut), resume="auto"))
    assert resumed.state.step == 20
    resumed_summary = resumed.fit()
    assert_resumed_exactly(
        full,
        resumed,
        (full_summary, resumed_summary),
        ["test_auc", "test_logloss", "test_ne", "steps", "samples"],
    )


@pytest.mark.usefixtures("long_training")
def test_a_registered_kind_exports_and_the_predictor_scores_it(toy, tmp_path):
    Trainer(TrainConfig(**TINY, data_size=64 * 30, out_dir=str(tmp_path / "run"))).fit()
    out = tmp_path / "int8"
    assert quantize([str(tmp_path / "run"), "--out", str(out), "--mlp-precision", "int8",
                     "--batch-size", "256"]) == 0  # fmt: skip
    source = load_source(tmp_path / "run")
    assert isinstance(source.arch, ToyArch)
    model, layers = from_float_state(source.arch, source.tables, source.state, ["int8"] * 4, "int8")
    assert set(layers.values()) == {"int8"}
    batch = next(iter(take_batches(data_source(source, None, "test", 128), 1).batches()))
    expected = torch.sigmoid(model(batch.dense_features, batch.sparse_features))
    predictor = Predictor.load(out)
    assert predictor.manifest["model"]["model"] == "toy" and predictor.kind is toy
    assert torch.equal(predictor.predict(batch), expected)
    ids = torch.stack([v.values() for v in batch.sparse_features.to_dict().values()], dim=1)
    by_rows = predictor.predict_rows(batch.dense_features, ids)
    assert torch.allclose(by_rows, expected, rtol=0, atol=1e-6)


def test_model_choices_come_from_the_registry(toy, tmp_path):
    assert kind_names() == ("dlrm", "tbsm", "toy")
    assert TrainConfig(**TINY, out_dir=str(tmp_path / "run")).arch.model == "toy"
    unregister(toy.name)
    with pytest.raises(ConfigError, match=r"^--model: expected one of dlrm, tbsm, got 'toy'$"):
        TrainConfig(**TINY, out_dir=str(tmp_path / "run"))


def test_a_checkpoint_of_an_unknown_kind_is_refused_naming_it(toy, tmp_path):
    Trainer(TrainConfig(**TINY, data_size=64 * 10, out_dir=str(tmp_path / "run"))).fit()
    unregister(toy.name)
    with pytest.raises(CheckpointError, match=r"no model kind named 'toy' \(known: dlrm, tbsm\)"):
        load_source(tmp_path / "run")


# comparisons of a setting, signature or manifest with a kind's name (`model == "tbsm"`,
# `"tbsm" != kind`, `model in ("dlrm", ...)`), the questions a kind answers instead
_ASKED_BY_NAME = r"""(==|!=|\bin)\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=|\bin\b)"""
PRODUCT = ("dlrm", "embeddings", "data_pipeline", "perfmodel", "hybrid_dlrm", "scripts")


def test_no_product_module_asks_a_model_kind_by_name():
    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(_ASKED_BY_NAME.format(names="|".join(kind_names())))
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for package in PRODUCT
        for path in sorted((root / package).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)
