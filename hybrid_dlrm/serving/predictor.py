"""`Predictor`: a verified inference artifact, ready to score batches.

    from hybrid_dlrm.serving import Predictor
    predictor = Predictor.load("artifacts/kaggle-int8")
    probabilities = predictor.predict(batch)     # a torchrec Batch, or (dense, sparse)

DLRM and TBSM artifacts alike (a TBSM batch holds every step of each sample, see DESIGN.md).
Loading verifies every file of the artifact first (hybrid_dlrm/serving/artifact.py); raw Criteo lines are scored
by `python -m hybrid_dlrm.serving.predict`, which maps them as training did with what the artifact carries.

    predictor = Predictor.load("artifacts/terabyte-int8", scm_dir="/ssd/serve", scm_cache="1GB")

serves tables larger than memory: their rows are copied into the SSD tier in `scm_dir` (once:
a later load of the same artifact finds them there) and read through a DRAM row cache of
`scm_cache` bytes (embeddings/ssd/serving.py); the scores equal the in-memory predictor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dlrm.models.kinds import ModelKind, kind_of
from dlrm.models.quantized import build_model, convert_dense
from hybrid_dlrm.serving import artifact as art
from hybrid_dlrm.serving.model_tensors import arch_from_json, load_dense_tensors

BACKENDS = ("auto", "fbgemm", "torch")

if TYPE_CHECKING:  # torchrec costs seconds to import; scoring raw lines (predict_rows) needs none
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class Predictor:
    def __init__(self, artifact: art.Artifact, model: torch.nn.Module, device: torch.device):
        self.artifact = artifact
        self.model = model
        self.device = device

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        backend: str = "auto",
        scm_dir: str | Path | None = None,
        scm_cache: str | int = "256MB",
        scm_io: str = "direct",
        scm_io_threads: int = 16,
    ) -> Predictor:
        """Read and verify the artifact at `path` and build its model on `device` (`backend`:
        auto, fbgemm or torch for the tables; `scm_dir`: the tables served from the SSD tier
        there, through a row cache of `scm_cache` bytes). ArtifactError names any file that is
        wrong; a wrong argument is a ValueError naming it."""
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected auto, fbgemm or torch, got {backend!r}")
        a = art.load(path, map_tables=scm_dir is not None)
        device = torch.device(device)
        embeddings = None
        if scm_dir is not None:
            embeddings = _serve_from_tier(a, device, scm_dir, scm_cache, scm_io, scm_io_threads)
        precision = a.manifest["dense"].get("precision")
        if precision == "int8" and device.type != "cpu":
            raise art.ArtifactError(
                f"{a.path}: int8 MLPs run on CPU only (torch's dynamic quantization); export "
                f"with --mlp-precision bf16 or fp32 for {device.type}"
            )
        try:
            arch = arch_from_json(a.manifest["model"])
            model = build_model(arch, a.tables, a.precisions, a.rows, device, backend, embeddings)
            convert_dense(model, precision)
            load_dense_tensors(model, a.dense)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            if isinstance(e, art.ArtifactError):
                raise
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise art.ArtifactError(
                f"{a.path / art.MANIFEST}: does not describe its tensors ({why})"
            ) from None
        return cls(a, model.eval(), device)

    @property
    def manifest(self) -> dict:
        return self.artifact.manifest

    @property
    def kind(self) -> ModelKind:
        return kind_of(self.model.arch)

    @property
    def feature_names(self) -> list[str]:
        return [t.feature_name for t in self.artifact.tables]

    @torch.no_grad()
    def logits(self, batch: Batch | tuple[torch.Tensor, KeyedJaggedTensor]) -> torch.Tensor:
        if isinstance(batch, tuple):
            dense, sparse = batch
        else:
            dense, sparse = batch.dense_features, batch.sparse_features
        self.check_ids(sparse)
        return self.model(dense.to(self.device), sparse.to(self.device)).float()

    def predict(self, batch: Batch | tuple[torch.Tensor, KeyedJaggedTensor]) -> torch.Tensor:
        """Click probabilities [B] (TBSM: one per sample, for its candidate)."""
        return torch.sigmoid(self.logits(batch))

    def predict_bags(
        self, dense: torch.Tensor, bags: Sequence[Sequence[Sequence[int]]]
    ) -> torch.Tensor:
        """Click probabilities [B] of samples with any number of ids per feature (multi-hot, as
        MLPerf's DLRM-DCNv2 data): `bags[i][f]` the ids of sample i's feature f (feature order,
        an empty list for none), each bag sum-pooled. The numbers of `predict` on the
        KeyedJaggedTensor of those bags (DLRM only; a one-hot batch may use `predict_rows`)."""
        if self.kind.layout != "candidate":
            raise TypeError(
                f"predict_bags scores DLRM samples; a {self.kind.title} sample is a sequence "
                "(predict)"
            )
        return self.predict((dense, bags_to_kjt(bags, self.feature_names)))

    @torch.no_grad()
    def predict_rows(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Click probabilities [B] of rows with one id per feature, as raw Criteo lines have:
        dense features [B, num_dense] and ids [B, num_sparse] in feature order. The same numbers
        as `predict` on the equivalent KeyedJaggedTensor, without building one (DLRM only)."""
        if self.kind.layout != "candidate":
            raise TypeError(
                f"predict_rows scores DLRM rows; a {self.kind.title} sample is a sequence (predict)"
            )
        self.check_rows(dense, ids)
        batch, tables = ids.shape
        values = ids.to(self.device).t().reshape(-1)  # feature-major, as a KJT holds them
        offsets = torch.arange(batch * tables + 1, dtype=values.dtype, device=self.device)
        pooled = self.model.embeddings.pooled(values, offsets, batch)
        return torch.sigmoid(self.model.dense_forward(dense.to(self.device), pooled).float())

    def check_ids(self, sparse: KeyedJaggedTensor) -> None:
        """ValueError naming features that are not the artifact's (both lists), or the first id of
        `sparse` outside its table (its sample, feature and table): a lookup past a table's end
        is a raw kernel error, and -1 no error at all."""
        tables = {t.feature_name: t for t in self.artifact.tables}
        if list(sparse.keys()) != list(tables):
            raise ValueError(
                f"the batch's features ({_names(sparse.keys())}) are not the artifact's "
                f"({_names(list(tables))}), in its order"
            )
        values, offsets = sparse.values().cpu(), sparse.offsets().cpu()
        stride, start = sparse.stride(), 0
        for k, (key, n) in enumerate(zip(sparse.keys(), sparse.length_per_key())):
            t = tables.get(key)
            if t is not None and n:
                v = values[start : start + n]
                bad = torch.nonzero((v < 0) | (v >= t.num_embeddings))
                if bad.numel():
                    i = start + int(bad[0, 0])
                    bag = int(torch.searchsorted(offsets, torch.tensor(i), right=True)) - 1
                    raise ValueError(
                        f"row {bag - k * stride}: id {int(values[i])} of feature {key} is "
                        f"outside table {t.name} ({t.num_embeddings} rows)"
                    )
            start += n

    def check_rows(self, dense: torch.Tensor, ids: torch.Tensor) -> None:
        """ValueError naming what does not fit: a column count, or the first id outside its
        table (its row of the batch, its feature and table)."""
        tables = self.artifact.tables
        num_dense = self.artifact.manifest["model"].get("num_dense")
        if ids.dim() != 2 or ids.shape[1] != len(tables):
            raise ValueError(
                f"ids: expected {len(tables)} columns (one per table), found "
                f"{ids.shape[1] if ids.dim() == 2 else f'{ids.dim()} dimensions'}"
            )
        if dense.dim() != 2 or (num_dense is not None and dense.shape[1] != num_dense):
            found = dense.shape[1] if dense.dim() == 2 else f"{dense.dim()} dimensions"
            raise ValueError(f"dense: expected {num_dense} columns, found {found}")
        if dense.shape[0] != ids.shape[0]:
            raise ValueError(f"{ids.shape[0]} rows of ids, {dense.shape[0]} of dense")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"ids: expected integers, found {ids.dtype}")
        sizes = torch.tensor([t.num_embeddings for t in tables], dtype=torch.int64)
        ids = ids.cpu().long()
        bad = torch.nonzero((ids < 0) | (ids >= sizes), as_tuple=False)
        if bad.numel():
            row, col = int(bad[0, 0]), int(bad[0, 1])
            t = tables[col]
            raise ValueError(
                f"row {row}: id {int(ids[row, col])} of feature {t.feature_name} is outside "
                f"table {t.name} ({t.num_embeddings} rows)"
            )


def bags_to_kjt(bags: Sequence[Sequence[Sequence[int]]], names: list[str]) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor (keys `names`) of sample-major bags: `bags[i][f]`, sample i's ids of
    feature f. ValueError naming the first sample whose number of features is not len(names)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    for i, sample in enumerate(bags):
        if len(sample) != len(names):
            raise ValueError(f"bags: sample {i} has {len(sample)} features, expected {len(names)}")
    by_feature = [[list(sample[f]) for sample in bags] for f in range(len(names))]
    lengths = [len(bag) for feature in by_feature for bag in feature]
    values = [v for feature in by_feature for bag in feature for v in bag]
    return KeyedJaggedTensor(
        keys=list(names), values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int32), stride=len(bags),
    )  # fmt: skip


def _serve_from_tier(a: art.Artifact, device, scm_dir, scm_cache, scm_io, scm_io_threads):
    from embeddings.errors import ScmError
    from embeddings.hot_rows import parse_bytes
    from embeddings.ssd.serving import ScmQuantizedEmbeddingBagCollection, ServingTier

    files = a.manifest["files"]
    sources = [(a.path / t["file"], files[t["file"]]["sha256"]) for t in a.manifest["tables"]]
    from hybrid_dlrm.serving.tier_dir import claim

    try:
        cache = parse_bytes(scm_cache, "--scm-cache")
        scm_dir = claim(scm_dir)
        tier = ServingTier(scm_dir, a.tables, a.precisions, sources, cache, scm_io, scm_io_threads)
    except (ScmError, ValueError) as e:
        raise art.ArtifactError(str(e)) from None
    a.rows = []  # the memory-mapped tables are not needed: the tier serves them
    return ScmQuantizedEmbeddingBagCollection(tier, device)


def _names(keys: list[str]) -> str:
    """cat_0..cat_25 for a long run of the usual names, else the names."""
    keys = list(keys)
    if len(keys) > 4:
        return f"{len(keys)}: {', '.join(keys[:2])}, ..., {keys[-1]}"
    return ", ".join(keys) or "none"
