"""Issue 37's serving cases for scripts/hostile_probes.py: an inference artifact and a tiered
training run added to its world, and the probes of `python -m hybrid_dlrm.serving.predict` and `Predictor`
(manifest checksums and structure, ids, --out, --scm-dir, --data, CRLF input)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

ART, TIER_RUN = "serve_art", "serve_tier_run"  # names no earlier probe uses
_ARCH = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1",
         "--mini-batch-size", "32", "--progress", "false"]  # fmt: skip
_TIERED = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
           "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
           "--data-size", "256", "--test-data-size", "128", "--progress", "false",
           "--placement", "tiered", "--hot-budget", "1KB", "--scm-cache", "4KB",
           "--scm-io", "buffered"]  # fmt: skip


def build(base: Path, root: Path) -> None:
    """The artifact ART (a Kaggle-shaped run on the world's `kdata`, quantized) and a tiered run
    TIER_RUN with its tier in TIER_RUN/scm."""

    def run(argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=root)
        if done.returncode != 0:
            raise SystemExit(f"building the serving world failed: {argv}\n{done.stderr}")

    py = sys.executable
    run([py, "-m", "dlrm.train", *_ARCH, "--data-set", "kaggle", "--processed-data-file",
         str(base / "kdata"), "--num-batches", "4", "--out-dir", str(base / "serve_run")])  # fmt: skip
    run(
        [
            py,
            "-m",
            "hybrid_dlrm.serving.quantize",
            str(base / "serve_run"),
            "--out",
            str(base / ART),
        ]
    )
    run([py, "-m", "dlrm.train", *_TIERED, "--out-dir", str(base / TIER_RUN)])


def predict(w: Path, *args: str, data: str = "kraw/train.txt") -> list[str]:
    return [sys.executable, "-m", "hybrid_dlrm.serving.predict", "--model", str(w / ART),
            "--data", str(w / data), *args]  # fmt: skip


def library(w: Path, code: str) -> list[str]:
    """`code` run with `p`, the artifact's Predictor, and torch; a ValueError is its one line."""
    wrapped = (
        "import sys, torch\nfrom hybrid_dlrm.serving import Predictor\n"
        f"try:\n    p = Predictor.load({str(w / ART)!r})\n    {code}\n"
        "except ValueError as e:\n    print(f'error: {e}', file=sys.stderr); sys.exit(2)\n"
    )
    return [sys.executable, "-c", wrapped]


def _body(w: Path) -> tuple[dict, dict]:
    sealed = json.loads((w / ART / "manifest.json").read_text())
    return {k: sealed[k] for k in ("format", "format_version")}, sealed["body"]


def reseal(w: Path, edit) -> None:
    """The manifest's body changed by `edit` and sealed again: only its structure is wrong."""
    from hybrid_dlrm.common.manifest import seal

    head, body = _body(w)
    edit(body)
    (w / ART / "manifest.json").write_text(json.dumps({**head, **seal(body)}))


def crlf(w: Path) -> None:
    raw = w / "kraw/train.txt"
    (w / "crlf.txt").write_bytes(raw.read_bytes().replace(b"\n", b"\r\n"))


def device_node(path: Path) -> None:
    """A character device like /dev/null (as root; a FIFO otherwise): what --out must not
    replace, made here so that a regression replaces this one, not the system's."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        os.mkfifo(path)


def fake_training_tier(w: Path) -> None:
    """The tiered run's tier with its tier.json removed (a damaged run's directory)."""
    (w / TIER_RUN / "scm" / "tier.json").unlink()


def add_probes(add, C: str, W_: str, M: str) -> None:
    art_files = (f"{ART}/manifest.json", f"{ART}/tables/t_cat_0.npy", "kraw/train.txt")
    # 5: every byte the results depend on is checksummed
    add("predict: a value in the artifact's manifest.json edited (max_ind_range)", C,
        lambda w: ((w / ART / "manifest.json").write_text((w / ART / "manifest.json").read_text().replace('"max_ind_range": 1000', '"max_ind_range": 999')),
                   predict(w, "--out", str(w / "p.csv")))[1],
        says="manifest.json: corrupt: its contents do not match their checksum")  # fmt: skip
    add("predict: an artifact of format version 1 (manifest without a checksum)", C,
        lambda w: ((w / ART / "manifest.json").write_text(json.dumps({**_body(w)[1], "format": _body(w)[0]["format"], "format_version": 1})),
                   predict(w, "--out", str(w / "p.csv")))[1],
        says="re-export it")  # fmt: skip
    # 13: a structurally wrong manifest
    add("predict: manifest with its last table entry removed (resealed)", C,
        lambda w: (reseal(w, lambda b: b["tables"].pop()), predict(w, "--out", str(w / "p.csv")))[1],
        says="'tables': 25 entries, the model has 26 tables")  # fmt: skip
    add("predict: manifest whose files is a list (resealed)", C,
        lambda w: (reseal(w, lambda b: b.update(files=list(b["files"]))), predict(w, "--out", str(w / "p.csv")))[1],
        says="'files': expected a JSON object, found list")  # fmt: skip
    add("predict: manifest with its last table entry removed (not resealed)", C,
        lambda w: ((w / ART / "manifest.json").write_text(json.dumps({**_body(w)[0], "body": {**_body(w)[1], "tables": _body(w)[1]["tables"][:-1]}, "crc32": json.loads((w / ART / "manifest.json").read_text())["crc32"]})),
                   predict(w, "--out", str(w / "p.csv")))[1],
        says="do not match their checksum")  # fmt: skip
    # 7 and 19: the library
    add("Predictor.predict_rows: an id of -1", M,
        lambda w: library(w, "ids = torch.zeros(4, 26, dtype=torch.long); ids[2, 5] = -1; p.predict_rows(torch.zeros(4, 13), ids)"),
        says="row 2: id -1 of feature cat_5 is outside table t_cat_5")  # fmt: skip
    add("Predictor.predict_rows: an id past its table's end", M,
        lambda w: library(w, "ids = torch.zeros(4, 26, dtype=torch.long); ids[3, 0] = 10**6; p.predict_rows(torch.zeros(4, 13), ids)"),
        says="row 3: id 1000000 of feature cat_0 is outside table t_cat_0")  # fmt: skip
    add("Predictor.predict_rows: 25 id columns for 26 tables", M,
        lambda w: library(w, "p.predict_rows(torch.zeros(4, 13), torch.zeros(4, 25, dtype=torch.long))"),
        says="ids: expected 26 columns (one per table), found 25")  # fmt: skip
    add("Predictor.load(backend='xyz')", M,
        lambda w: library(w, "Predictor.load(p.artifact.path, backend='xyz')"),
        says="backend: expected auto, fbgemm or torch, got 'xyz'")  # fmt: skip
    add("predict --embedding-backend xyz", M,
        lambda w: predict(w, "--out", str(w / "p.csv"), "--embedding-backend", "xyz"),
        says="--embedding-backend: expected auto, fbgemm or torch")  # fmt: skip
    # 8: --out destroys nothing
    add("predict --out: an existing file", W_,
        lambda w: ((w / "p.csv").write_text("earlier\n"), predict(w, "--out", str(w / "p.csv")))[1],
        says="already exists; pass --overwrite", keep=["p.csv"])  # fmt: skip
    add("predict --out: an existing file with --overwrite", W_,
        lambda w: ((w / "p.csv").write_text("earlier\n"), predict(w, "--out", str(w / "p.csv"), "--overwrite"))[1],
        expect="survive")  # fmt: skip
    for label, rel in [("the input itself (--out = --data)", "kraw/train.txt"),
                       ("the artifact's manifest.json", f"{ART}/manifest.json"),
                       ("a table file of the artifact", f"{ART}/tables/t_cat_0.npy")]:  # fmt: skip
        for extra in ((), ("--overwrite",)):
            add(f"predict --out: {label}{' with --overwrite' if extra else ''}", W_,
                lambda w, r=rel, e=extra: predict(w, "--out", str(w / r), *e),
                says="never written over", keep=art_files)  # fmt: skip
    add("predict --out: a hard link to the input, with --overwrite", W_,
        lambda w: (os.link(w / "kraw/train.txt", w / "link.csv"), predict(w, "--out", str(w / "link.csv"), "--overwrite"))[1],
        says="never written over", keep=art_files)  # fmt: skip
    add("predict --out: a symbolic link, with --overwrite", W_,
        lambda w: ((w / "kept.csv").write_text("kept\n"), (w / "sym.csv").symlink_to(w / "kept.csv"),
                   predict(w, "--out", str(w / "sym.csv"), "--overwrite"))[2],
        says="is a symbolic link", keep=["kept.csv"])  # fmt: skip
    add("predict --out: a device node (like /dev/null), with --overwrite", W_,
        lambda w: (device_node(w / "null"), predict(w, "--out", str(w / "null"), "--overwrite"))[1],
        says="expected the name of a predictions CSV")  # fmt: skip
    add("predict --out -: the CSV on stdout", W_,
        lambda w: predict(w, "--out", "-"), expect="survive")  # fmt: skip
    # 9 and 16: the tier directory
    add("predict --scm-dir: a training run's tier", W_,
        lambda w: predict(w, "--out", str(w / "p.csv"), "--scm-dir", str(w / TIER_RUN / "scm")),
        says="holds the SSD tier of the training run", keep=[f"{TIER_RUN}/scm/rows.dat", f"{TIER_RUN}/scm/tier.json"])  # fmt: skip
    add("predict --scm-dir: a training run's tier without its tier.json", W_,
        lambda w: (fake_training_tier(w), predict(w, "--out", str(w / "p.csv"), "--scm-dir", str(w / TIER_RUN / "scm")))[1],
        says="holds the SSD tier of the training run", keep=[f"{TIER_RUN}/scm/rows.dat"])  # fmt: skip
    add("predict --scm-dir: a file", M,
        lambda w: predict(w, "--out", str(w / "p.csv"), "--scm-dir", str(w / "kraw/train.txt")),
        says="--scm-dir", keep=["kraw/train.txt"])  # fmt: skip
    add("predict --scm-dir: a path below a file", M,
        lambda w: predict(w, "--out", str(w / "p.csv"), "--scm-dir", str(w / "kraw/train.txt/scm")),
        says="is a file, not a directory", keep=["kraw/train.txt"])  # fmt: skip
    # 18: quantizing a tiered run reads the cold rows from its tier, which it leaves as it was
    tier_files = [f"{TIER_RUN}/scm/{n}" for n in ("rows.dat", "journal.log", "tier.json")]
    add("quantize: a tiered run's directory", M,
        lambda w: [sys.executable, "-m", "hybrid_dlrm.serving.quantize", str(w / TIER_RUN), "--out", str(w / "qt"),
                   "--emb-precision", "int8"],
        expect="survive", keep=tier_files)  # fmt: skip
    add("quantize: a tiered run whose tier lost its rows.dat", C,
        lambda w: ((w / TIER_RUN / "scm" / "rows.dat").unlink(),
                   [sys.executable, "-m", "hybrid_dlrm.serving.quantize", str(w / TIER_RUN), "--out", str(w / "qt")])[1],
        says="rows.dat: the run's SSD tier file is missing")  # fmt: skip
    # 17: --data
    add("predict --data: a directory that is not a data set", M,
        lambda w: ((w / "somedir").mkdir(), predict(w, "--out", str(w / "p.csv"), data="somedir"))[1],
        says="a directory without meta.json")  # fmt: skip
    # 14: CRLF line ends, both sides
    add("predict: raw input with CRLF line ends", M,
        lambda w: (crlf(w), predict(w, "--out", str(w / "p.csv"), data="crlf.txt"))[1],
        expect="survive")  # fmt: skip
    add("predict: raw input with CRLF line ends, --on-bad-line skip", M,
        lambda w: (crlf(w), predict(w, "--out", str(w / "p.csv"), "--on-bad-line", "skip", data="crlf.txt"))[1],
        expect="survive")  # fmt: skip
    add("preprocess: raw input with CRLF line ends", M,
        lambda w: (crlf(w), [sys.executable, "-m", "data_pipeline", "preprocess", "--dataset", "kaggle", "--raw",
                             str(w / "crlf.txt"), "--out", str(w / "kcrlf"), "--max-ind-range", "1000", "--no-progress"])[1],
        expect="survive")  # fmt: skip
