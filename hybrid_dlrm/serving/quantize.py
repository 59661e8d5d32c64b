"""`python -m hybrid_dlrm.serving.quantize`: a trained model -> an inference artifact at chosen precisions, and
the accuracy monitor that compares an artifact with its float source.

    python -m hybrid_dlrm.serving.quantize RUN_OR_MODEL --out ARTIFACT [--emb-precision int8] [--mlp-precision int8]
        [--emb-precision-table cat_2=int4,cat_11=int2] [--ne-budget 0.001] [--debug]
    python -m hybrid_dlrm.serving.quantize --check ARTIFACT --against RUN_OR_MODEL [--data DIR --split test]

Export reads a run directory (its newest checkpoint that verifies), a checkpoint or a
`--save-model` file; calibrates on the `val` split of the run's data (or `--data`); writes the
artifact (hybrid_dlrm/serving/artifact.py) with the calibration metrics of the float and the quantized model.
`--emb-precision auto` searches the precision per table (hybrid_dlrm/serving/precision_search.py); `--debug`
prints the SQNR per table and layer (hybrid_dlrm/serving/numeric_debug.py). `--check` prints one JSON object:
`reference` and `quantized` (auc, ne, logloss, calibration = mean prediction / mean label) and
`moved_share` (the share of predictions that moved by more than 0.01).

A mistake (a bad flag, a missing or corrupt file) is one line naming it, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from data_pipeline.errors import DataError
from dlrm.errors import ArchError, CheckpointError, ConfigError
from dlrm.metrics import binary_metrics
from dlrm.models.quantized import MLP_PRECISIONS, from_float_state
from dlrm.run_layout import run_files
from dlrm.train import EXIT_USAGE, OneLineParser
from embeddings.quantized import TABLE_PRECISIONS, check_precision
from hybrid_dlrm.common import cli_lines, quick
from hybrid_dlrm.common.outputs import check_output
from hybrid_dlrm.serving.artifact import ARTIFACT_DIRECTORY, ArtifactError, ArtifactWriter
from hybrid_dlrm.serving.inference_data import (
    BatchList,
    Source,
    categorical_mapping,
    data_source,
    load_source,
    take_batches,
)
from hybrid_dlrm.serving.model_tensors import arch_to_json, dense_tensors, model_bytes
from hybrid_dlrm.serving.precision_search import fp32_model_bytes, plot

PROG = "python -m hybrid_dlrm.serving.quantize"
EMB_CHOICES = (*TABLE_PRECISIONS, "auto")
MOVED = 0.01  # a prediction "moved" when its probability changed by more than this


def build_parser(parser: type[argparse.ArgumentParser] = OneLineParser) -> argparse.ArgumentParser:
    p = parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("source", nargs="?", help="run directory, checkpoint or --save-model file")
    p.add_argument("--out", help="the artifact directory to write (must not exist)")
    p.add_argument("--emb-precision", default="int8", help=f"one of {', '.join(EMB_CHOICES)}")
    p.add_argument("--emb-precision-table", default="",
                   help="per-table overrides, e.g. cat_2=int4,cat_11=int2 (feature or table names)")  # fmt: skip
    p.add_argument("--mlp-precision", default="fp32", help=f"one of {', '.join(MLP_PRECISIONS)}")
    p.add_argument("--ne-budget", type=float, default=0.001,
                   help="auto: the largest relative NE increase allowed (default 0.001 = 0.1%%)")  # fmt: skip
    p.add_argument(
        "--data", help="preprocessed data set to calibrate or compare on (default: the run's)"
    )
    p.add_argument("--split", help="split of --data (default: val to calibrate, test to --check)")
    p.add_argument("--batches", type=int, default=16, help="batches to use (0: the whole split)")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--mapping-data", help="preprocessed Criteo directory whose categorical mapping "
                   "the artifact carries (default: the run's data, or --data)")  # fmt: skip
    p.add_argument("--debug", action="store_true", help="print SQNR per table and layer")
    p.add_argument("--embedding-backend", default="auto", help="auto, fbgemm or torch")
    p.add_argument("--check", metavar="ARTIFACT", help="compare ARTIFACT with --against")
    p.add_argument("--against", metavar="RUN_OR_MODEL", help="--check: the float source")
    return p


def parse_overrides(text: str, tables) -> dict[int, str]:
    """'cat_2=int4,cat_11=int2' -> {table index: precision}."""
    out: dict[int, str] = {}
    by_name = {}
    for i, t in enumerate(tables):
        by_name[t.feature_name] = by_name[t.name] = i
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, precision = item.partition("=")
        if not sep:
            raise ConfigError(f"--emb-precision-table: expected NAME=PRECISION, got {item!r}")
        if name not in by_name:
            raise ConfigError(
                f"--emb-precision-table: no table {name!r} (tables: {tables[0].feature_name} .. "
                f"{tables[-1].feature_name})"
            )
        t = tables[by_name[name]]
        try:
            check_precision(precision, t.embedding_dim, name)
        except ValueError as e:
            raise ConfigError(f"--emb-precision-table: {e}") from None
        out[by_name[name]] = precision
    return out


def _inputs(a: argparse.Namespace) -> dict[str, Path]:
    """What an export reads: never written by --out (a run directory: its run files)."""
    source = Path(a.source)
    inputs = run_files(source, "the source's") if source.is_dir() else {"the source": source}
    for flag, value in (("--data", a.data), ("--mapping-data", a.mapping_data)):
        if value:
            inputs[flag] = Path(value)
    return inputs


def _check_args(a: argparse.Namespace) -> None:
    if a.check:
        if not a.against:
            raise ConfigError("--check: needs --against RUN_OR_MODEL (the float source)")
        return
    if not a.source:
        raise ConfigError("a source is needed: a run directory, checkpoint or --save-model file")
    if not a.out:
        raise ConfigError("--out: needs the artifact directory to write")
    # ArtifactError, as ArtifactWriter raised it before: what a library caller catches
    check_output(a.out, "--out", ARTIFACT_DIRECTORY, protected=_inputs(a), error=ArtifactError)
    if a.emb_precision not in EMB_CHOICES:
        raise ConfigError(
            f"--emb-precision: expected one of {', '.join(EMB_CHOICES)}, got {a.emb_precision!r}"
        )
    if a.mlp_precision not in MLP_PRECISIONS:
        raise ConfigError(
            f"--mlp-precision: expected one of {', '.join(MLP_PRECISIONS)}, got {a.mlp_precision!r}"
        )
    if not (0.0 <= a.ne_budget < 1.0):
        raise ConfigError(f"--ne-budget: expected a relative increase in [0, 1), got {a.ne_budget}")
    if a.batches < 0 or a.batch_size < 1:
        raise ConfigError("--batches, --batch-size: expected a count >= 0 and a size >= 1")
    if a.embedding_backend not in ("auto", "fbgemm", "torch"):
        raise ConfigError(
            f"--embedding-backend: expected auto, fbgemm or torch, got {a.embedding_backend!r}"
        )


# --- scoring -----------------------------------------------------------------------------------


@torch.no_grad()
def logits_of(model: torch.nn.Module, batches: BatchList) -> tuple[torch.Tensor, torch.Tensor]:
    out, labels = [], []
    for b in batches.batches(0):
        out.append(model(b.dense_features, b.sparse_features).float())
        labels.append(b.labels)
    return torch.cat(out), torch.cat(labels)


def metrics_of(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    m = binary_metrics(logits, labels)
    mean_p = torch.sigmoid(logits).mean().item()
    return {"auc": m["auc"], "ne": m["ne"], "logloss": m["logloss"],
            "calibration": mean_p / m["ctr"] if m["ctr"] > 0 else float("nan"),
            "samples": m["samples"]}  # fmt: skip


# --- export --------------------------------------------------------------------------------------


def _precisions(a, source: Source, cal: BatchList | None) -> tuple[list[str], dict | None]:
    tables = source.tables
    overrides = parse_overrides(a.emb_precision_table, tables)
    if a.emb_precision != "auto":
        for t in tables:
            try:
                check_precision(a.emb_precision, t.embedding_dim, t.feature_name)
            except ValueError as e:
                raise ConfigError(f"--emb-precision: {e}") from None
        return [overrides.get(i, a.emb_precision) for i in range(len(tables))], None
    from hybrid_dlrm.serving.precision_search import LEVELS, Calibration, search

    if cal is None:
        raise ConfigError("--emb-precision auto: needs calibration data (--data)")
    allowed = {}
    for i, t in enumerate(tables):
        if i in overrides:
            allowed[i] = (overrides[i],)
        else:  # the levels this table's dimension allows
            allowed[i] = tuple(p for p in LEVELS if _fits(p, t.embedding_dim))
    calib = Calibration(source.arch, tables, source.state, cal, a.mlp_precision)
    record = search(calib, a.ne_budget, allowed)
    return [record["choice"][t.feature_name] for t in tables], record


def _fits(precision: str, dim: int) -> bool:
    try:
        check_precision(precision, dim)
        return True
    except ValueError:
        return False


def export(a: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    source = load_source(a.source)
    writer = ArtifactWriter(Path(a.out))  # refuses an existing artifact before any long work
    try:
        return _export(a, source, writer, t0)
    except BaseException:
        writer.abort()
        raise


def _export(a, source: Source, writer: ArtifactWriter, t0: float) -> dict:
    mapping, vocab_dir = categorical_mapping(source, a.mapping_data or a.data)
    cal = None
    try:
        cal_source = data_source(source, a.data, a.split or "val", a.batch_size)
        cal = take_batches(cal_source, a.batches)
    except ConfigError as e:
        if a.emb_precision == "auto" or a.debug or a.data:
            raise
        logging.getLogger(__name__).warning(
            "no calibration data (%s): the manifest has no calibration metrics", e)  # fmt: skip
    precisions, record = _precisions(a, source, cal)
    backend = a.embedding_backend
    model, layers = from_float_state(source.arch, source.tables, source.state, precisions,
                                     a.mlp_precision, backend=backend)  # fmt: skip
    calibration = None
    reference = None
    if cal is not None:
        reference, _ = from_float_state(source.arch, source.tables, source.state,
                                        ["fp32"] * len(precisions), "fp32", backend=backend)  # fmt: skip
        ref_logits, labels = logits_of(reference, cal)
        q_logits, _ = logits_of(model, cal)
        calibration = {"split": a.split or "val", "fp32": metrics_of(ref_logits, labels),
                       "quantized": metrics_of(q_logits, labels)}  # fmt: skip
        calibration["ne_change"] = calibration["quantized"]["ne"] / calibration["fp32"]["ne"] - 1
    table_files = []
    for t, rows in zip(source.tables, model.embeddings.table_rows()):
        table_files.append(writer.tensor("tables", t.name, rows))
    dense_files = {k: writer.tensor("dense", k, v) for k, v in dense_tensors(model).items()}
    if vocab_dir is not None:
        for i in range(len(source.tables)):
            for kind in ("sorted_values", "sorted_ids"):
                rel = f"mapping/cat_{i}.{kind}.npy"
                try:
                    shutil.copyfile(vocab_dir / f"cat_{i}.{kind}.npy", writer.path(rel))
                except OSError as e:
                    raise ArtifactError(
                        f"{vocab_dir / f'cat_{i}.{kind}.npy'}: cannot be read ({e})"
                    ) from None
                writer.adopt(rel)
        mapping["dir"] = "mapping"
    sizes = model_bytes(model)
    fp32_bytes = fp32_model_bytes(source.tables, source.state, source.arch)
    if record is not None:
        record["dense_bytes"] = sizes["dense_bytes"]
        record["exported"] = calibration
        writer.write_bytes("sensitivity.json", (json.dumps(record, indent=1) + "\n").encode())
        try:
            plot(record, writer.path("sensitivity.png"))
        except OSError as e:
            raise writer.error(e, Path(a.out) / "sensitivity.png") from None
        writer.adopt("sensitivity.png")
    manifest = {
        "model": arch_to_json(source.arch),
        "features": {
            "num_dense": source.arch.num_dense,
            "sparse": [t.feature_name for t in source.tables],
        },  # fmt: skip
        "tables": [
            {
                "name": t.name,
                "feature": t.feature_name,
                "rows": t.num_embeddings,
                "dim": t.embedding_dim,
                "precision": p,
                "bytes": int(r.numel()),
                "file": f,
            }
            for t, p, r, f in zip(
                source.tables, precisions, model.embeddings.table_rows(), table_files
            )
        ],  # fmt: skip
        "dense": {"precision": a.mlp_precision, "layers": layers, "files": dense_files},
        "bytes": {
            **sizes,
            "fp32_model_bytes": fp32_bytes,
            "share_of_fp32": sizes["model_bytes"] / fp32_bytes,
        },  # fmt: skip
        "calibration": calibration,
        "categorical": mapping,
        "input": {"format": "criteo", "dense_transform": "log(max(x, 0) + 1), empty = 0"}
        if mapping
        else None,
        "source": {
            "path": str(source.path),
            "sha256": source.sha256(),
            "step": source.step,
            "config": source.config,
        },  # fmt: skip
        "precision_search": {"budget": record["budget"], "within_budget": record["within_budget"]}
        if record
        else None,
        "made_by": {
            "tool": PROG,
            "argv": sys.argv[1:],
            "python": platform.python_version(),
            "torch": torch.__version__,
            "seconds": None,
        },  # fmt: skip
    }
    manifest["made_by"]["seconds"] = round(time.perf_counter() - t0, 3)
    writer.finish(manifest)
    if a.debug:
        from hybrid_dlrm.serving.numeric_debug import format_report, sqnr_report

        print(format_report(sqnr_report(reference, model, cal)))
    return manifest


# --- the accuracy monitor -------------------------------------------------------------------------


def check(a: argparse.Namespace) -> dict:
    from hybrid_dlrm.serving.predictor import Predictor

    predictor = Predictor.load(a.check, backend=a.embedding_backend)
    source = load_source(a.against)
    sig = predictor.manifest["source"]["sha256"]
    if sig != source.sha256():
        logging.getLogger(__name__).warning(
            "%s was exported from another file than %s (SHA-256 differs)", a.check, source.path)  # fmt: skip
    reference, _ = from_float_state(source.arch, source.tables, source.state,
                                    ["fp32"] * len(source.tables), "fp32",
                                    backend=a.embedding_backend)  # fmt: skip
    data = take_batches(data_source(source, a.data, a.split or "test", a.batch_size), a.batches)
    ref_logits, labels = logits_of(reference, data)
    q_logits, _ = logits_of(predictor.model, data)
    moved = (torch.sigmoid(q_logits) - torch.sigmoid(ref_logits)).abs() > MOVED
    return {
        "artifact": str(a.check),
        "against": str(source.path),
        "data": str(a.data or "the run's"),
        "split": a.split or "test",
        "samples": int(labels.numel()),
        "reference": metrics_of(ref_logits, labels),
        "quantized": metrics_of(q_logits, labels),
        "moved_share": moved.float().mean().item(),
    }


class _RaisingParser(OneLineParser):
    """The command's parser for a library caller: a flag mistake is a ConfigError to catch."""

    def error(self, message: str) -> None:
        raise ConfigError(message)


def quantize(argv: list[str]) -> dict:
    """The command's work for a library user, with its arguments: the artifact's manifest (or,
    with --check, the comparison). A mistake raises the typed error the command would report
    (ConfigError, DataError, CheckpointError, ArtifactError, ArchError); exit codes are main's.

        quantize(["runs/a", "--out", "art/int8", "--emb-precision", "int8"])
    """
    return _run(build_parser(_RaisingParser).parse_args(argv))


def _run(a: argparse.Namespace) -> dict:
    """The command's work on parsed arguments: --check's comparison, or the export's manifest."""
    _check_args(a)
    return check(a) if a.check else export(a)


def main(argv: list[str] | None = None) -> int:
    cli_lines.log_to_stderr(PROG)  # warnings as `{prog}: warning: ...`
    a = build_parser().parse_args(argv)
    if quick.active() and not a.check:  # the docs' walk (hybrid_dlrm/common/quick.py)
        a.batches = quick.cap("--batches", a.batches)
        quick.announce(PROG)
    try:
        manifest = _run(a)
    except (ConfigError, DataError, CheckpointError, ArtifactError, ArchError) as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return EXIT_USAGE
    if a.check:
        print(json.dumps(manifest))
        return 0
    b = manifest["bytes"]
    cal = manifest["calibration"]
    line = f"wrote {a.out}: {b['model_bytes']} bytes ({100 * b['share_of_fp32']:.1f}% of fp32)"
    if cal:
        line += (f"; calibration NE {cal['quantized']['ne']:.5f} vs fp32 {cal['fp32']['ne']:.5f} "
                 f"({100 * cal['ne_change']:+.3f}%)")  # fmt: skip
    print(line)
    return 0


if __name__ == "__main__":
    from hybrid_dlrm.common import endings  # Ctrl-C / SIGTERM: one line, exit 130 / 143

    sys.exit(endings.run(main, left=lambda: "nothing written"))  # its writes are atomic
