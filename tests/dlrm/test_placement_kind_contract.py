"""The placement-kind contract (dlrm/placement/kinds.py): a toy placement kind defined here, and
registered only while these tests run, is a `--placement` choice, trains through the Trainer
(bit-identically to the device placement it computes the same as), is weighed by the planner
(`--placement auto`) with its own prediction, winning where it is predicted fastest and
dominated where it is not, and is among the memory check's suggestions (the same enumerator),
with no edit anywhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlrm import Trainer
from dlrm.data import build_data
from dlrm.errors import ConfigError
from dlrm.placement import auto as planner
from dlrm.placement import memory_check
from dlrm.placement.candidates import Candidate, KindPredictor, Prediction, StepTime
from dlrm.placement.kinds import (
    CHOICES,
    PlacementKind,
    kind_names,
    placement_kind,
    register,
    unregister,
)
from dlrm.placement.run_plan import PlacedEmbeddings
from embeddings import FusedEmbeddingBagCollection
from embeddings.hot_rows import row_bytes
from embeddings.room import MemoryInventory, Needs, Room

MiB, GiB = 2**20, 2**30
CPU = torch.device("cpu")
BIG = dict(arch_embedding_size=(200_000, 100_000, 5_000, 70), test_data_size=256)


class ToyRowStore(FusedEmbeddingBagCollection):
    """Every row in one plain host tensor, looked up by PyTorch's own bag ops (the fused
    collection's pure-PyTorch path), reporting itself as the toy placement."""

    def placement_info(self) -> dict:
        return {"kind": "toy", "backend": self.backend}


class Toy:
    """The toy placement: every table in host memory as plain tensors; predicted as host's step
    scaled by `speed` (its own rule, made from the performance model's pieces)."""

    name = "toy"
    help = "every table in one plain host tensor (a test's placement)"
    tuned_by = ()
    preference = 5
    multi_process = None
    one_home = False
    initial_rows = ("uniform",)
    regroups_batches = False

    def __init__(self, speed: float = 1.0) -> None:
        self.speed = speed

    def check(self, cfg) -> None:
        if cfg.arch.embedding_backend == "fbgemm":
            raise ConfigError("--embedding-backend fbgemm: not with --placement toy")

    def settings(self, candidate, cfg) -> dict:
        return {}

    def memory_needs(self, cfg, tables) -> Needs:
        opt = cfg.training.sparse_optimizer()
        total = sum(t.num_embeddings * row_bytes(t.embedding_dim, opt) for t in tables)
        return Needs().add("host", "toy rows + optimizer state", total, rows=True)

    def rows_on_device(self, candidate, total: int) -> int:
        return 0

    def build(self, cfg, tables, train_source, device) -> PlacedEmbeddings:
        coll = ToyRowStore(tables, cfg.training.sparse_optimizer(), device=device,
                           backend="torch", seed=cfg.training.seed)  # fmt: skip
        return PlacedEmbeddings(coll, self.name)

    def training_data(self, cfg, data, placed, per_epoch: int):
        return data

    def bytes_per_sample(self, candidate, coverage) -> float | None:
        return None

    def candidates(self, space) -> list:
        return [Candidate(self.name)]

    def predict(self, costs, cfg, candidate, sample) -> Prediction:
        host = costs.captured(cfg, sample, "host").parts
        parts = StepTime(dense=host.dense * self.speed, lookup=host.lookup * self.speed)
        return Prediction.of(parts, {"source": "toy rule"})


class FixedCosts:
    """Step costs of fixed figures (dlrm/placement/candidates.py's StepCosts), per placement."""

    LOOKUP = {"device": 0.5, "host": 3.0, "fae": 2.0}

    def captured(self, cfg, sample, placement: str) -> Prediction:
        return Prediction.of(StepTime(dense=1.0, lookup=self.LOOKUP[placement]))

    def link(self, cfg, sample):
        return 0.0, 0

    def staged(self, cfg, candidate, sample, cold: str) -> Prediction:
        return Prediction.of(StepTime(dense=1.0, lookup=1.0, staging=2.0))


@pytest.fixture
def toy():
    kind = register(Toy())
    yield kind
    unregister(kind.name)


class FixedMemory(planner.RunMemory):
    """A CUDA-like inventory whose device is too small for every table."""

    def room(self, cfg, device) -> MemoryInventory:
        return MemoryInventory(Room(2 * MiB, "fake device"), Room(8 * GiB, "fake host"),
                               Room(64 * GiB, "fake disk"))  # fmt: skip


def toy_planner(speed: float) -> planner.Planner:
    placement_kind("toy").speed = speed
    return planner.Planner(memory=FixedMemory(), predictor=KindPredictor(FixedCosts()))


def test_a_registered_kind_is_a_choice_and_meets_the_contract(toy, make_config):
    assert isinstance(toy, PlacementKind) and "toy" in kind_names() and "toy" in CHOICES
    assert CHOICES["toy"] == toy.help and make_config(placement="toy").placement == "toy"
    with pytest.raises(ConfigError, match="--embedding-backend fbgemm: not with --placement toy"):
        make_config(placement="toy", embedding_backend="fbgemm")  # its own rules are checked
    unregister("toy")
    with pytest.raises(ConfigError, match="--placement: expected one of .*, got 'toy'"):
        make_config(placement="toy")
    register(toy)


def test_placement_toy_trains_as_the_device_placement_it_computes_the_same_as(
    toy, make_config, tmp_path
):
    steps = dict(num_batches=6, embedding_backend="torch")
    trained = Trainer(make_config(placement="toy", **steps))
    assert isinstance(trained.model.embeddings, ToyRowStore)
    summary = trained.fit()
    reference = Trainer(make_config(placement="device", **steps, out_dir=str(tmp_path / "ref")))
    want = reference.fit()
    assert summary["placement"]["kind"] == "toy" and summary["steps"] == 6
    assert summary["test_logloss"] == want["test_logloss"]
    for a, b in zip(trained.model.embeddings.table_weights(),
                    reference.model.embeddings.table_weights()):  # fmt: skip
        assert torch.equal(a, b)


@pytest.mark.parametrize("speed, wins", [(0.1, True), (10.0, False)])
def test_the_planner_weighs_the_toy_kind_by_its_own_prediction(toy, make_config, speed, wins):
    cfg = make_config(**BIG, placement="auto")
    d = toy_planner(speed).plan(cfg, build_data(cfg), CPU, write=False)
    (row,) = [w for w in d.weighed if w.candidate.placement == "toy"]
    host = next(w for w in d.weighed if w.candidate.placement == "host")
    assert row.prediction.ms_per_step == pytest.approx(4.0 * speed)  # host's captured step, scaled
    assert row.prediction.detail["source"] == "toy rule"
    line = next(x for x in d.table().splitlines() if x.strip().startswith("toy "))
    assert f"{4.0 * speed:.2f}" in line
    if wins:
        assert d.chosen == Candidate("toy") and line.endswith("CHOSEN")
        assert host.rejected.endswith("on every predicted part")  # toy's parts are smaller
    else:
        assert d.chosen != Candidate("toy") and row.rejected.startswith("dominated by ")
        assert row.rejected.endswith("on every predicted part")


def test_auto_trains_the_toy_kind_where_it_is_predicted_fastest(toy, make_config, monkeypatch):
    monkeypatch.setattr(planner, "default_planner", lambda: toy_planner(0.1))
    t = Trainer(make_config(**BIG, placement="auto", num_batches=4, embedding_backend="torch"))
    summary = t.fit()
    decision = json.loads((Path(t.cfg.out_dir) / planner.DECISION_NAME).read_text())
    assert decision["settings"] == {"placement": "toy"} and summary["placement"]["kind"] == "toy"
    assert summary["placement"]["requested"] == "auto"


def test_the_memory_checks_suggestions_come_from_the_same_enumerator(toy, make_config, monkeypatch):
    monkeypatch.setattr(memory_check, "inventory", lambda *a, **k: FixedMemory().room(None, None))
    monkeypatch.setattr("embeddings.room.disk_room", lambda d: Room(64 * GiB, "fake disk"))
    cfg = make_config(**BIG, placement="device")
    with pytest.raises(ConfigError) as e:
        memory_check.check_memory(cfg, build_data(cfg), CPU)
    fixes = str(e.value).split("settings that fit: ")[1].split(", or ")
    assert fixes[0] == "--placement host" and fixes[-1] == "--placement toy"
