import pytest
import torch

from dlrm.config import TrainConfig


def tiny(tmp_path, **overrides) -> TrainConfig:
    """A model and data set small enough for a test to train in about a second."""
    base = dict(
        arch_embedding_size=(60, 40, 500, 7),
        arch_sparse_feature_size=4,
        arch_mlp_bot=(13, 16, 4),
        arch_mlp_top=(16, 1),
        mini_batch_size=64,
        data_size=64 * 30,
        test_data_size=2048,
        learning_rate=0.1,
        print_freq=10,
        out_dir=str(tmp_path / "run"),
        progress=False,
    )
    base.update(overrides)
    return TrainConfig(**base)


@pytest.fixture
def make_config(tmp_path):
    return lambda **kw: tiny(tmp_path, **kw)


def assert_resumed_exactly(full, resumed, summaries: tuple[dict, dict], keys: list[str]) -> None:
    """A resumed Trainer ended where the uninterrupted one did: every tensor of the model and of
    the sparse optimizer bit-identical, and the summaries' `keys` equal."""
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for sa, sb in zip(
        full.model.embeddings.optimizer_states(), resumed.model.embeddings.optimizer_states()
    ):
        assert (sa is None and sb is None) or torch.equal(sa, sb)
    want, got = summaries
    for key in keys:
        assert want[key] == got[key], key
