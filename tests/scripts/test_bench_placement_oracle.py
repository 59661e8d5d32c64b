"""The FAE bound printed by bench_placement: checked against sampled inputs from the generator."""

import importlib.util
from pathlib import Path

import numpy as np

from data_pipeline.synthetic import PlantedWorld, SyntheticConfig
from dlrm import TrainConfig

_SPEC = importlib.util.spec_from_file_location(
    "bench_placement", Path(__file__).resolve().parents[2] / "scripts" / "bench_placement.py"
)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)

SIZES = (50, 2000, 300, 10_000)


def _cfg(budget: str) -> TrainConfig:
    return TrainConfig(arch_embedding_size=SIZES, arch_sparse_feature_size=4, arch_mlp_bot=(13, 4),
                       arch_mlp_top=(1,), synthetic_zipf=1.05, hot_budget=budget, seed=5)  # fmt: skip


def test_oracle_share_matches_sampled_inputs():
    cfg = _cfg("40KB")  # 40960 B / 16 B per row (dim 4, SGD) = 2560 hot rows
    bound = bench.oracle_bound(cfg)
    assert bound["budget_rows"] == 2560 and bound["hot_rows"] == 2560
    assert sum(bound["hot_rows_per_table"]) == 2560
    world = PlantedWorld(SyntheticConfig(table_sizes=list(SIZES), zipf_alpha=1.05, seed=5))
    rows = world.chunk("train", 0)[0].numpy()  # [tables, samples]
    for k in range(1, 8):
        rows = np.concatenate([rows, world.chunk("train", k)[0].numpy()], axis=1)
    hot = np.array(bound["hot_rows_per_table"])[:, None]
    sampled = (rows < hot).all(axis=0).mean()  # an id is hot iff it is in its table's hot prefix
    assert abs(sampled - bound["all_hot_input_share"]) < 0.01  # 65k inputs: sd about 0.002
    assert bound["max_bytes_ratio_host_over_fae"] == round(
        1 / (1 - bound["all_hot_input_share"]), 3
    )


def test_oracle_grows_with_the_budget():
    """More budget never lowers the bound; enough budget for every row makes every input hot."""
    shares = [
        bench.oracle_bound(_cfg(b))["all_hot_input_share"] for b in ("1KB", "10KB", "40KB", "1MB")
    ]
    assert shares == sorted(shares)
    assert shares[-1] == 1.0
