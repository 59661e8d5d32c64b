"""Every placement trains a few steps of the tiny model. The fast tier (`make test-fast`) keeps
this much of each whatever the tier rule (tests/conftest.py) sends to the slow tier: the deeper
tests (exactness against the device placement, resume, crashes) train longer."""

import math

import pytest

from dlrm import Trainer
from dlrm.pipelines.slipstream import SlipstreamTrainPipeline

STEPS = 6
HOT = dict(hot_budget="2KB", profile_sample_rate=0.2)
# name -> (flags, the kind of embedding collection the run reports)
PLACEMENTS = {
    "device": (dict(placement="device"), "device"),
    "host": (dict(placement="host"), "host"),
    "fae": (dict(placement="fae", fae_switch_period=4, **HOT), "fae"),
    "hotline": (dict(placement="hotline", **HOT), "hotline"),
    "tiered": (dict(placement="tiered", scm_cache="2KB", scm_io="buffered", **HOT), "tiered"),
    "slipstream": (dict(slipstream=True, slipstream_interval=2, slipstream_warmup=2), "device"),
}


@pytest.mark.parametrize("name", PLACEMENTS)
def test_the_placement_trains_a_few_steps(make_config, tmp_path, name):
    flags, kind = PLACEMENTS[name]
    cfg = make_config(**flags, device="cpu", num_batches=STEPS, test_data_size=256,
                      scm_dir=str(tmp_path / "scm"))  # fmt: skip
    trainer = Trainer(cfg)
    before = [t.detach().clone() for t in trainer.model.embeddings.table_weights()]
    summary = trainer.fit()
    assert summary["steps"] == STEPS
    assert summary["placement"]["kind"] == kind
    assert isinstance(trainer.pipeline, SlipstreamTrainPipeline) == (name == "slipstream")
    assert math.isfinite(summary["test_logloss"]) and 0.0 < summary["test_auc"] < 1.0
    after = trainer.model.embeddings.table_weights()
    assert any(not b.equal(a) for b, a in zip(before, after)), "no embedding row was trained"
