"""The staging pipeline is chosen by what a collection declares (embeddings/staged/contract.py), never by
its placement kind."""

from contextlib import contextmanager
from types import SimpleNamespace

import torch

from dlrm import compose
from dlrm.config import TrainConfig
from dlrm.pipelines.base import PlainTrainPipeline
from dlrm.pipelines.staging import HotlineTrainPipeline
from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, TableSpec
from embeddings.staged.contract import StagingCollection, stages


class _Stager(FusedEmbeddingBagCollection):
    """A collection of a kind no pipeline has heard of that declares staging."""

    version, plan, learned_batches = 0, object(), 0

    def stage(self, features, inputs=None, version=None):
        return features

    @contextmanager
    def using(self, staged, waited_s=None):
        yield 0

    def observe(self, features):
        pass

    def adopt(self, plan):
        pass

    def placement_info(self) -> dict:
        return {"kind": "my-own", "backend": self.backend}


def _pipeline(embeddings):
    model = SimpleNamespace(embeddings=embeddings)
    dense_optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    return compose._pipeline(TrainConfig(), model, dense_optimizer, torch.device("cpu"), None,
                             None, 1)  # fmt: skip


def test_a_collection_that_declares_staging_gets_the_staging_pipeline():
    tables = [TableSpec("t0", 10, 4, "f0")]
    stager, plain = _Stager(tables, SparseOptimizer()), FusedEmbeddingBagCollection(tables)
    assert stages(stager) and isinstance(stager, StagingCollection)
    assert not stages(plain)
    pipeline = _pipeline(stager)
    assert isinstance(pipeline, HotlineTrainPipeline)
    pipeline._pool.shutdown()
    chosen = _pipeline(plain)
    assert type(chosen) is PlainTrainPipeline
