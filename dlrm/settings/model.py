"""The model's settings: the DLRM architecture (facebookresearch/dlrm's flags) and TBSM's
(facebookresearch/tbsm's)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import ClassVar

from dlrm.errors import ConfigError
from dlrm.models.kinds import KIND_NAMES
from dlrm.settings.fields import POSITIVE, Section, setting


def parse_widths(text: str | list[int] | tuple[int, ...], flag: str) -> tuple[int, ...]:
    """'13-512-256' -> (13, 512, 256), the reference's dash-separated layer widths."""
    if isinstance(text, (list, tuple)):
        # whole numbers only: int(4.5) or int(None) would pass a float on or raise a TypeError
        if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in text):
            raise ConfigError(f"{flag}: expected a sequence of integers, got {text!r}")
        widths = tuple(int(x) for x in text)
    else:
        try:
            widths = tuple(int(x) for x in str(text).split("-"))
        except ValueError:
            raise ConfigError(
                f"{flag}: expected dash-separated integers like 13-512-256, got {text!r}"
            ) from None
    if not widths or min(widths) < 1:
        raise ConfigError(f"{flag}: every width must be a positive integer, got {text!r}")
    return widths


REFERENCE = "the data set's reference"


@dataclass
class ArchConfig(Section):
    """Which model, and the DLRM architecture (None: the data set's reference recipe,
    dlrm/recipes/*.toml)."""

    title: ClassVar[str] = "Model (DLRM architecture)"

    model: str = setting("dlrm", "--model", "the model", choices=KIND_NAMES)
    sparse_feature_size: int | None = setting(
        None, "--arch-sparse-feature-size", "embedding dimension", check=POSITIVE,
        shown_default=REFERENCE,
    )  # fmt: skip
    embedding_size: tuple[int, ...] | None = setting(
        None, "--arch-embedding-size", "rows per table, dash-separated", parse=parse_widths,
        shown_default="the data set's table sizes",
    )  # fmt: skip
    mlp_bot: tuple[int, ...] | None = setting(
        None, "--arch-mlp-bot", "bottom MLP widths, input first, e.g. 13-512-256-64-16",
        parse=parse_widths, shown_default=REFERENCE,
    )  # fmt: skip
    mlp_top: tuple[int, ...] | None = setting(
        None, "--arch-mlp-top", "top MLP widths after the interaction, ending in 1, e.g. 512-256-1",
        parse=parse_widths, shown_default=REFERENCE,
    )  # fmt: skip
    interaction_op: str = setting(
        "dot", "--arch-interaction-op", "feature interaction (dcn: DCNv2's low-rank cross layers)",
        choices=("dot", "cat", "dcn"),
    )  # fmt: skip
    interaction_itself: bool = setting(
        False, "--arch-interaction-itself", "include each feature's dot with itself"
    )
    dcn_num_layers: int = setting(
        3, "--dcn-num-layers", "--arch-interaction-op dcn: cross layers", check=POSITIVE
    )
    dcn_low_rank_dim: int = setting(
        512, "--dcn-low-rank-dim", "--arch-interaction-op dcn: rank of each cross layer's kernels",
        check=POSITIVE,
    )  # fmt: skip
    embedding_backend: str = setting(
        "auto", "--embedding-backend", "the embedding kernels (auto: fbgemm where it has them)",
        choices=("auto", "fbgemm", "torch"),
    )  # fmt: skip


@dataclass
class TbsmConfig(Section):
    """TBSM (`--model tbsm`): names and meaning as in facebookresearch/tbsm."""

    title: ClassVar[str] = "TBSM (--model tbsm)"

    ts_length: int = setting(
        20, "--ts-length", "history steps before the candidate", check=POSITIVE
    )
    model_type: str = setting(
        "tsl", "--model-type", "the sequence model", choices=("tsl", "mha", "rnn")
    )
    tsl_inner: str = setting(
        "def", "--tsl-inner", "tsl's inner product: dot, ind (A w) or def (A^T A w)",
        choices=("dot", "ind", "def"),
    )  # fmt: skip
    tsl_mechanism: str = setting(
        "mlp", "--tsl-mechanism", "tsl's attention mechanism", choices=("mul", "mlp")
    )
    tsl_num_heads: int = setting(
        1, "--tsl-num-heads", "TSL components, each with its own MLP", check=POSITIVE
    )
    tsl_mlp: tuple[int, ...] = setting(
        (15, 15), "--tsl-mlp", "attention MLP hidden widths (--ts-length added at both ends)",
        parse=parse_widths,
    )  # fmt: skip
    arch_mlp: tuple[int, ...] = setting(
        (60, 1), "--arch-mlp", "final MLP widths after [context, candidate], ending in 1",
        parse=parse_widths,
    )  # fmt: skip
    tsl_proj: bool = setting(
        True, "--tsl-proj", "project history and candidate onto the unit sphere (tsl)"
    )
    mha_num_heads: int = setting(
        8, "--mha-num-heads", "--model-type mha: attention heads", check=POSITIVE
    )
    rnn_num_layers: int = setting(
        1, "--rnn-num-layers", "--model-type rnn: LSTM layers", check=POSITIVE
    )
    points_per_user: int = setting(
        10, "--points-per-user", "taobao: positive samples (each with a negative) per user and split",
        check=POSITIVE,
    )  # fmt: skip
