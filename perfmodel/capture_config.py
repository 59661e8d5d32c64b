"""The configuration a step graph is captured from (`perfmodel.graph`) for the planner's
predictions (perfmodel/placement_costs.py) and the calibration's traced step
(perfmodel/calibration.py): huge tables scaled down, a Criteo data set that large replaced by
synthetic data of its tables' sizes, another placement's settings at their defaults."""

from __future__ import annotations

from typing import Any

from dlrm.config import TrainConfig
from dlrm.models.kinds import model_kind

CAPTURE_ROWS = 4_000_000  # larger synthetic tables are captured scaled down (`capturable`)

# data sets whose steps a synthetic one of the same tables repeats (13 dense features, one id
# per table and input, or the bags `--multi-hot-sizes` asks for, as the synthetic data makes)
CRITEO_LAYOUTS = ("kaggle", "terabyte")


def capturable(cfg, sizes: list[int], max_rows: int = CAPTURE_ROWS):
    """The config the step graph is captured from (None: too large to build, and no synthetic
    stand-in). Tables over `max_rows` rows in all are captured scaled down (the embedding
    kernels are told the real sizes); a Criteo data set that large is captured as synthetic data
    with its tables' sizes (its files are not read: a step's operators do not depend on them)."""
    total_rows = int(sum(sizes))
    if total_rows <= max_rows:
        return cfg
    f = max_rows / total_rows
    # smaller tables: a profile or plan of the real ones does not fit them (FAE makes its own)
    changes: dict[str, Any] = {"synthetic_table_scale": cfg.data.synthetic_table_scale * f,
                               "profile_file": None, "placement_plan": None}  # fmt: skip
    # a candidate's row is all a Criteo sample is: synthetic data of its tables' sizes stands in
    candidate = model_kind(cfg.arch.model).layout == "candidate"
    if cfg.data.data_set in CRITEO_LAYOUTS and candidate:
        changes.update(data_set="synthetic", raw_data_file=None, processed_data_file=None,
                       max_ind_range=None, arch_embedding_size=list(sizes))  # fmt: skip
    elif cfg.data.data_set != "synthetic":
        return None
    sizes_given = changes.get("arch_embedding_size") or cfg.arch.embedding_size
    if sizes_given:
        changes["arch_embedding_size"] = [max(1, int(n * f)) for n in sizes_given]
    if cfg.placing.placement == "fae":  # the same share of the (smaller) tables on the device
        changes["hot_budget"] = max(1, int(cfg.placing.hot_budget.bytes * f))
    return cfg.replace(**changes)


# A device or host step runs the same operators whatever another placement's settings are: they
# are set to their defaults for the capture, so its graph (cached by the whole configuration) is
# captured once, not once per candidate (15 captures were 13 of a 14 s plan)
UNPLACED = {k: v for k, v in TrainConfig().to_json().items()
             if k in ("hot_budget", "profile_sample_rate", "profile_file", "placement_plan",
                      "fae_switch_period", "fae_order", "hotline_prefetch",
                      "hotline_learn_batches") or k.startswith("scm_")}  # fmt: skip
