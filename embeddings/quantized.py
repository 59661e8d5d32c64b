"""Row-wise quantized embedding tables for inference: fp32, fp16, int8, int4 or int2 per table.

A quantized table is one uint8 tensor [rows, row_bytes] in the row layout of fbgemm's integer
table-batched embedding (`IntNBitTableBatchedEmbeddingBagsCodegen`, row alignment 1 as on CPU):

- fp32 / fp16: the row's values as bytes;
- intN (N = 8, 4, 2): a float16 scale and a float16 bias (4 bytes), then the row's dim values
  as N-bit unsigned codes, packed low bits first (value = code * scale + bias).

Scale and bias are rounded to float16 BEFORE the codes are computed (bias rounded down, so no
value lies below it), so the codes are the nearest ones under the float16 parameters that are
actually stored; fbgemm's own int8 packer computes codes against float32 parameters and its
table format then rounds them to float16, an extra error this avoids.

`QuantizedEmbeddingBagCollection` has the lookup contract's face (`forward(kjt) ->
KeyedTensor`) and runs every table in one fbgemm integer TBE where fbgemm has a kernel for the
device (CPU with fbgemm-gpu-cpu, CUDA with fbgemm-gpu), otherwise a pure-PyTorch path that
dequantises only the rows a batch looks up and sums them: the same outputs (to float32 rounding
of the sums), tested against each other.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from embeddings._fbgemm import fbgemm_has_kernels_for as _fbgemm_has_kernels_for
from embeddings.collection import EmbeddingLookup
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.kjt_ops import in_feature_order
from embeddings.transfer_stats import no_transfer_counters

if (
    TYPE_CHECKING
):  # torchrec costs seconds to import; `python -m hybrid_dlrm.serving.predict` needs none of it
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

log = logging.getLogger(__name__)

TABLE_PRECISIONS = ("fp32", "fp16", "int8", "int4", "int2")
BITS = {"int8": 8, "int4": 4, "int2": 2}
SCALE_BIAS_BYTES = 4  # float16 scale, float16 bias
_CHUNK_ROWS = 1 << 20  # rows quantized at once: bounds the float32 temporaries
_FP16_MAX = 32768.0  # rows beyond it could round a float16 scale or bias to infinity


def check_precision(precision: str, dim: int, table: str = "") -> None:
    """A precision the table can take (packed codes must fill whole bytes, as fbgemm needs)."""
    where = f"table {table}: " if table else ""
    if precision not in TABLE_PRECISIONS:
        raise ValueError(
            f"{where}unknown precision {precision!r}: expected one of {', '.join(TABLE_PRECISIONS)}"
        )
    bits = BITS.get(precision)
    if bits and dim % (8 // bits):
        raise ValueError(
            f"{where}{precision} needs a dimension divisible by {8 // bits}, got {dim}"
        )


def row_bytes(dim: int, precision: str) -> int:
    """Bytes one row of width `dim` takes at `precision` (the stored and the served size)."""
    if precision == "fp32":
        return 4 * dim
    if precision == "fp16":
        return 2 * dim
    return SCALE_BIAS_BYTES + dim * BITS[precision] // 8


def table_bytes(rows: int, dim: int, precision: str) -> int:
    return rows * row_bytes(dim, precision)


# --- quantize / dequantize rows ---------------------------------------------------------------


def _quantize_chunk(w: torch.Tensor, bits: int) -> torch.Tensor:
    levels = (1 << bits) - 1
    lo = w.amin(dim=1)
    hi = w.amax(dim=1)
    bias = lo.half()
    # round the bias down: every value must lie at or above it
    over = bias.float() > lo
    bias[over] = torch.nextafter(bias[over], torch.tensor(float("-inf"), dtype=torch.half))
    bias_f = bias.float()
    scale = ((hi - bias_f) / levels).half()
    # a constant row (scale 0) or one whose range underflows float16: any scale gives code 0
    scale[(scale == 0) | ~torch.isfinite(scale)] = 1.0
    scale_f = scale.float()
    codes = torch.round((w - bias_f[:, None]) / scale_f[:, None]).clamp_(0, levels).to(torch.uint8)
    per_byte = 8 // bits
    codes = codes.view(w.shape[0], -1, per_byte)
    packed = codes[:, :, 0].clone()
    for k in range(1, per_byte):
        packed |= codes[:, :, k] << (k * bits)
    params = torch.stack([scale, bias], dim=1).view(torch.uint8)  # [rows, 4]
    return torch.cat([params, packed], dim=1)


def quantize_rows(weight: torch.Tensor, precision: str) -> torch.Tensor:
    """A float table [rows, dim] -> its rows at `precision`, uint8 [rows, row_bytes] (CPU)."""
    rows, dim = weight.shape
    check_precision(precision, dim)
    weight = weight.detach()
    if precision == "fp32":
        return weight.float().cpu().contiguous().view(torch.uint8).view(rows, 4 * dim)
    largest = float(weight.abs().max()) if weight.numel() else 0.0
    if not largest <= _FP16_MAX:  # also NaN
        raise ValueError(
            f"values up to {largest:g} do not fit {precision}'s float16 range (scale and bias "
            "are float16): keep this table at fp32"
        )
    if precision == "fp16":
        return weight.half().cpu().contiguous().view(torch.uint8).view(rows, 2 * dim)
    out = torch.empty(rows, row_bytes(dim, precision), dtype=torch.uint8)
    for lo in range(0, rows, _CHUNK_ROWS):
        chunk = weight[lo : lo + _CHUNK_ROWS].float().cpu()
        out[lo : lo + len(chunk)] = _quantize_chunk(chunk, BITS[precision])
    return out


def dequantize_rows(rows: torch.Tensor, precision: str, dim: int) -> torch.Tensor:
    """uint8 rows at `precision` -> float32 [n, dim], on the rows' device."""
    n = rows.shape[0]
    if precision == "fp32":
        return rows.contiguous().view(torch.float32).view(n, dim)
    if precision == "fp16":
        return rows.contiguous().view(torch.float16).view(n, dim).float()
    bits = BITS[precision]
    params = rows[:, :SCALE_BIAS_BYTES].contiguous().view(torch.float16).float()  # [n, 2]
    packed = rows[:, SCALE_BIAS_BYTES:]
    mask = (1 << bits) - 1
    codes = torch.stack([(packed >> (k * bits)) & mask for k in range(8 // bits)], dim=2)
    codes = codes.view(n, dim).float()
    return torch.addcmul(params[:, 1:2], codes, params[:, 0:1])


# --- the collection -----------------------------------------------------------------------------


class QuantizedEmbeddingBagCollection(EmbeddingLookup):
    """Sum-pooled lookups in tables stored at per-table precisions; inference only (the lookup
    contract: it does not train, checkpoint or load a state dict)."""

    def __init__(
        self,
        tables: list[TableSpec],
        precisions: list[str],
        rows: list[torch.Tensor],
        device: torch.device | str | None = None,
        backend: str = "auto",
    ) -> None:
        """`rows[t]`: table t as `quantize_rows` makes it."""
        super().__init__()
        if not (len(tables) == len(precisions) == len(rows)) or not tables:
            raise ValueError(
                "a quantized collection needs one precision and one row tensor per table"
            )
        for t, p, r in zip(tables, precisions, rows):
            check_precision(p, t.embedding_dim, t.name)
            expected = (t.num_embeddings, row_bytes(t.embedding_dim, p))
            if r.dtype != torch.uint8 or tuple(r.shape) != expected:
                raise ValueError(
                    f"table {t.name}: rows {r.dtype} {tuple(r.shape)}, expected uint8 {expected}"
                )
        self.tables = list(tables)
        self.feature_names = [t.feature_name for t in tables]
        self.dims = [t.embedding_dim for t in tables]
        self.precisions = list(precisions)
        # trains nothing: SGD's optimizer has no state, what the run summary's bytes count
        self.optimizer = SparseOptimizer()
        self.device = torch.device(device or "cpu")
        if backend == "auto":
            backend = "fbgemm" if _fbgemm_has_kernels_for(self.device) else "torch"
        elif backend == "fbgemm" and not _fbgemm_has_kernels_for(self.device):
            raise ValueError(f"fbgemm has no integer table-batched kernel for {self.device} here")
        elif backend != "torch" and backend != "fbgemm":
            raise ValueError(
                f"unknown embedding backend {backend!r}: expected auto, fbgemm or torch"
            )
        self.backend = backend
        if backend == "fbgemm":
            impl = _make_fbgemm(self.tables, self.precisions, rows, self.device)
            object.__setattr__(self, "_impl", impl)  # not a submodule: no parameters, own layout
            self._rows: list[torch.Tensor] = []
        else:
            self._rows = [r.to(self.device) for r in rows]
        self._cpu_rows = [r.cpu() for r in rows]  # for export and the numeric debugger

    # --- lookups ----------------------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        from torchrec.sparse.jagged_tensor import KeyedTensor

        features = in_feature_order(features, self.feature_names)
        pooled = self.pooled(features.values(), features.offsets(), features.stride())
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)

    def pooled(self, values: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """The pooled embeddings [batch, sum of dims] of `batch` bags per table, tables in
        feature order (`offsets`: tables * batch + 1 bag boundaries into `values`): `forward`
        without a KeyedJaggedTensor."""
        if values.dtype != offsets.dtype:
            values, offsets = values.long(), offsets.long()
        if self.backend == "fbgemm":
            return self._impl(values, offsets)
        return self._torch_pooled(values, offsets, batch)

    def _torch_pooled(
        self, values: torch.Tensor, offsets: torch.Tensor, batch: int
    ) -> torch.Tensor:
        out = []
        for t, (rows, p, dim) in enumerate(zip(self._rows, self.precisions, self.dims)):
            bags = offsets[t * batch : (t + 1) * batch + 1]
            start, end = int(bags[0]), int(bags[-1])
            looked_up = dequantize_rows(rows[values[start:end]], p, dim)
            positions = torch.arange(end - start, device=values.device)
            out.append(F.embedding_bag(positions, looked_up, bags[:-1] - start, mode="sum"))
        return torch.cat(out, dim=1)

    def table_rows(self) -> list[torch.Tensor]:
        """Every table's stored rows (uint8, CPU), as given."""
        return list(self._cpu_rows)

    # --- the contract ------------------------------------------------------------------------

    def table_weights(self) -> list[torch.Tensor]:
        """Every table dequantised to float32 (new tensors, not views)."""
        return [
            dequantize_rows(r, p, d) for r, p, d in zip(self._cpu_rows, self.precisions, self.dims)
        ]

    def counters(self) -> dict:
        return no_transfer_counters()

    def placement_info(self) -> dict:
        return {"kind": "quantized", "backend": self.backend, "precisions": list(self.precisions)}


def _make_fbgemm(
    tables: list[TableSpec], precisions: list[str], rows: list[torch.Tensor], device: torch.device
):
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        BoundsCheckMode,
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    loc = EmbeddingLocation.HOST if device.type == "cpu" else EmbeddingLocation.DEVICE
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[
            (t.name, t.num_embeddings, t.embedding_dim, SparseType(p), loc)
            for t, p in zip(tables, precisions)
        ],
        pooling_mode=PoolingMode.SUM,
        device=device,
        bounds_check_mode=BoundsCheckMode.FATAL,
        output_dtype=SparseType.FP32,
    )
    tbe.initialize_weights()
    # split into (codes, scale-and-bias) so fbgemm pads rows as its device needs (16 on CUDA)
    with torch.no_grad():
        for (dst, dst_params), r, p in zip(tbe.split_embedding_weights(), rows, precisions):
            if p in BITS:
                dst.copy_(r[:, SCALE_BIAS_BYTES:])
                dst_params.copy_(r[:, :SCALE_BIAS_BYTES])
            else:
                dst.copy_(r)
    return tbe
