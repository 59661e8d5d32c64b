"""Models: DLRM (and TBSM, which reuses its pieces)."""

from dlrm.models.dlrm import DLRM, DLRMArch, Interaction, make_mlp

__all__ = ["DLRM", "DLRMArch", "Interaction", "make_mlp"]
