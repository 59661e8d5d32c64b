"""Models: DLRM (and TBSM, which reuses its pieces), each a registered kind (kinds.py) that
meets the declared model contract (contract.py).

The model classes are imported on first use: `--help` reads the kinds' names from kinds.py and
must not pay for importing torch.
"""

from dlrm.models.kinds import ModelKind, kind_names, kind_of, model_kind, register, unregister

__all__ = [
    "DLRM", "DLRMArch", "Interaction", "ModelKind", "RecModel", "kind_names", "kind_of",
    "make_mlp", "model_kind", "register", "unregister",
]  # fmt: skip


def __getattr__(name: str):
    if name in ("DLRM", "DLRMArch", "Interaction", "make_mlp"):
        from dlrm.models import dlrm

        return getattr(dlrm, name)
    if name == "RecModel":
        from dlrm.models.contract import RecModel

        return RecModel
    raise AttributeError(f"module 'dlrm.models' has no attribute {name!r}")
