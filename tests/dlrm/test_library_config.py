"""docs/library.md's promise: a bad value given to `TrainConfig` raises `dlrm.ConfigError` with
one line naming the flag (issue 37, 19: TypeError, ValueError and AttributeError escaped)."""

import pytest

from dlrm import ConfigError, TrainConfig


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("learning_rate", "fast", "--learning-rate"),
        ("mini_batch_size", "64", "--mini-batch-size"),
        ("mini_batch_size", 64.5, "--mini-batch-size"),
        ("nepochs", True, "--nepochs"),
        ("arch_mlp_bot", [13, "x"], "--arch-mlp-bot"),  # was ValueError
        ("arch_mlp_bot", (13, 4.5), "--arch-mlp-bot"),  # was accepted as (13, 4)
        ("arch_mlp_bot", (13, True), "--arch-mlp-bot"),  # was accepted as (13, 1)
        ("arch_embedding_size", (10, None), "--arch-embedding-size"),  # was TypeError
        ("allow_changed", ["lr", 3], "--allow-changed"),  # was AttributeError
        ("placement", "gpu", "--placement"),
        ("out_dir", 3, "--out-dir"),
    ],
)
def test_a_bad_value_is_one_config_error_naming_the_flag(field, value, flag):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**{field: value})
    assert str(e.value).startswith(f"{flag}: ") and "\n" not in str(e.value)


def test_good_values_of_the_same_fields_are_taken():
    cfg = TrainConfig(arch_mlp_bot=[13, 8, 4], arch_embedding_size="10-20", allow_changed=["lr"])
    assert cfg.arch_mlp_bot == (13, 8, 4) and cfg.arch_embedding_size == (10, 20)
    assert cfg.allow_changed == ("lr",)
