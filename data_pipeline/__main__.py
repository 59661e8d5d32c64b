"""Command line: `python -m data_pipeline preprocess|synth|info ...`.

    preprocess  raw Criteo Kaggle/Terabyte files -> a preprocessed directory (resumable), or
                a Taobao UserBehavior.csv -> a TBSM window directory (--dataset taobao)
    synth       write synthetic raw files: Criteo's Kaggle or Terabyte layout, or a planted
                Taobao UserBehavior.csv (--layout taobao; for trying things and tests)
    info        print a preprocessed directory's summary as JSON (Criteo or Taobao)
    multi-hot   materialise multi-hot bags from a preprocessed Criteo directory ahead of
                training (what `python -m dlrm.train --multi-hot-sizes` does on first use)

A data or option mistake prints one line `python -m data_pipeline COMMAND: error: ...` and exits
with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hybrid_dlrm.common import cli_lines, endings, quick
from hybrid_dlrm.common.outputs import Purpose, check_output

from .dataset_meta import load_meta, read_json
from .errors import DataError
from .preprocess import DATASETS, DEFAULT_TERABYTE_MAX_IND_RANGE, PreprocessOptions, preprocess
from .synthetic_raw import SyntheticSpec, write_kaggle, write_terabyte

# What each --out makes (hybrid_dlrm/common/outputs.py). A dataset directory of ours (meta.json,
# or an unfinished one's options.json) is reused, finished or refused by its maker, which checks
# its settings; synth adds files to any directory, each file checked itself: raw text carries no
# mark of who wrote it, so an existing one needs --overwrite.
DATASET_DIRECTORY = Purpose(
    "dataset directory", directory=True,
    identify=lambda d: (d / "meta.json").is_file() or (d / "options.json").is_file(),
)  # fmt: skip
RAW_DIRECTORY = Purpose("directory of raw files", directory=True, identify=lambda d: True)
RAW_FILE = Purpose("synthetic raw file")


def _check_out(args: argparse.Namespace) -> None:
    """Every path the command would write, against the output rule, before any work."""
    if args.command == "preprocess":
        inputs = {"--raw": args.raw, "--test-raw": args.test_raw}
        check_output(args.out, "--out", DATASET_DIRECTORY, protected=inputs, error=DataError)
    elif args.command == "multi-hot" and args.out is not None:
        inputs = {"the preprocessed directory": args.directory}
        check_output(args.out, "--out", DATASET_DIRECTORY, protected=inputs, error=DataError)
    elif args.command == "synth":
        check_output(args.out, "--out", RAW_DIRECTORY, error=DataError)
        if args.layout == "taobao":
            names = ["UserBehavior.csv"]
        elif args.layout == "kaggle":
            names = ["train.txt"] + (["test.txt"] if args.test_lines else [])
        else:
            gz = {d.strip() for d in args.gz_days.split(",")}
            names = [f"day_{d}" + (".gz" if str(d) in gz else "") for d in range(args.days)]
        for name in names:
            check_output(args.out / name, "--out", RAW_FILE, overwrite=args.overwrite,
                         error=DataError)  # fmt: skip


def _bad_lines(text: str | None) -> dict[str, int]:
    """'label=2,integer=1' -> {'label': 2, 'integer': 1}"""
    out: dict[str, int] = {}
    for item in filter(None, (text or "").split(",")):
        kind, _, count = item.partition("=")
        if not count.isdigit():
            raise DataError(f"--bad-lines: expected KIND=COUNT[,KIND=COUNT...], got {item!r}")
        out[kind] = int(count)
    return out


class _Parser(argparse.ArgumentParser):
    """A flag mistake is one line (as in dlrm.train), not the usage block; the subcommands'
    parsers are of this class too."""

    def error(self, message: str) -> None:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _synth_taobao(args: argparse.Namespace) -> Path:
    """A planted UserBehavior.csv (data_pipeline/taobao_synthetic.py): the next category
    follows the recent ones, so a history model has something to learn."""
    from .taobao_synthetic import BAD_KINDS, PlantedBehavior, write_user_behavior

    if args.users < 1:
        raise DataError(f"--users: expected a positive number of users, got {args.users}")
    bad = _bad_lines(args.bad_lines)
    unknown = sorted(set(bad) - set(BAD_KINDS))
    if unknown:
        raise DataError(f"--bad-lines: taobao kinds are {', '.join(BAD_KINDS)}, got {unknown[0]}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "UserBehavior.csv"
    write_user_behavior(path, PlantedBehavior(num_users=args.users, seed=args.seed), bad_lines=bad)
    return path


def _info(directory: Path) -> dict:
    """The summary of a preprocessed Criteo or Taobao directory (told apart by meta.json's
    format; each loader checks its own header)."""
    from .taobao import FORMAT as TAOBAO_FORMAT
    from .taobao import load_taobao_meta

    path = directory / "meta.json"
    meta = read_json(path) if path.is_file() else {}
    if meta.get("format") == TAOBAO_FORMAT:
        meta = load_taobao_meta(directory)
        rows = {split: v["rows"] for split, v in meta["splits"].items()}
        keys = ("dataset", "settings", "table_sizes", "ts_length", "index_dtype", "bad_lines",
                "made_by")  # fmt: skip
        return {**{k: meta[k] for k in keys}, "rows": rows}
    meta = load_meta(directory)
    keys = ("dataset", "settings", "table_sizes", "index_dtype", "rows", "bad_lines", "made_by")
    return {k: meta[k] for k in keys}


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m data_pipeline", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
    sub = p.add_subparsers(dest="command", required=True)

    pre = sub.add_parser("preprocess", help="raw Criteo files -> preprocessed directory")
    pre.add_argument("--dataset", required=True, choices=(*DATASETS, "taobao"))
    pre.add_argument(
        "--raw",
        required=True,
        type=Path,
        help="kaggle: train.txt or its directory; terabyte: the directory of day_N[.gz] or DIR/day",
    )
    pre.add_argument("--out", required=True, type=Path, help="output directory")
    pre.add_argument(
        "--test-raw", type=Path, help="kaggle: the unlabelled test.txt (inference part)"
    )
    pre.add_argument(
        "--max-ind-range",
        type=int,
        help="hash mode: id = value %% M (default for terabyte: 10000000); <= 0: frequency mode",
    )
    pre.add_argument(
        "--contiguous-ids",
        action="store_true",
        help="hash mode: renumber each feature's distinct value %% M to 0..n-1 (tables of n rows, "
        "as the reference's and MLPerf's preprocessing)",
    )
    pre.add_argument(
        "--frequency-threshold",
        type=int,
        help="frequency mode (default for kaggle): values seen fewer than T times share one id",
    )
    pre.add_argument("--data-sub-sample-rate", type=float, default=0.0, dest="sub_sample_rate")
    pre.add_argument("--seed", type=int, default=0, help="seeds the down-sampling")
    pre.add_argument("--on-bad-line", choices=("error", "skip"), default="error")
    pre.add_argument("--workers", type=int, help="parse processes (0: inline; default: automatic)")
    pre.add_argument("--block-mb", type=int, default=8, help="MB of raw text per task (>= 1)")
    pre.add_argument("--no-progress", action="store_true", help="no progress bar")
    pre.add_argument("--ts-length", type=int, default=20, help="taobao: history steps per sample")
    pre.add_argument(
        "--points-per-user", type=int, default=10, help="taobao: samples per user and split"
    )
    pre.add_argument(
        "--val-fraction", type=float, default=0.1, help="taobao: share of time for validation"
    )
    pre.add_argument(
        "--test-fraction", type=float, default=0.1, help="taobao: share of time for test"
    )
    pre.add_argument(
        "--memory-mb", type=int, default=2048, help="taobao: working-set bound (sets the buckets)"
    )

    syn = sub.add_parser("synth", help="write synthetic raw Criteo or Taobao files")
    syn.add_argument("--layout", required=True, choices=(*DATASETS, "taobao"))
    syn.add_argument(
        "--out", required=True, type=Path, help="a directory (taobao: DIR/UserBehavior.csv)"
    )
    syn.add_argument(
        "--lines", type=int, help="kaggle: train lines; terabyte: per day (required for both)"
    )
    syn.add_argument(
        "--users", type=int, default=2000, help="taobao: users (each 30-60 events by default)"
    )
    syn.add_argument("--test-lines", type=int, default=0, help="kaggle: unlabelled test.txt lines")
    syn.add_argument("--days", type=int, default=24, help="terabyte: number of day files")
    syn.add_argument("--gz-days", default="", help="terabyte: comma-separated days to gzip")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--vocab-cap", type=int, default=100_000, help="distinct values per feature")
    syn.add_argument(
        "--bad-lines",
        help="inject malformed lines: KIND=COUNT,... (kaggle train.txt, taobao's CSV)",
    )
    syn.add_argument("--overwrite", action="store_true", help="replace raw files already in --out")

    info = sub.add_parser("info", help="summary of a preprocessed directory")
    info.add_argument("directory", type=Path)

    mh = sub.add_parser("multi-hot", help="materialise multi-hot bags (docs/data.md)")
    mh.add_argument("directory", type=Path, help="a preprocessed Criteo directory")
    mh.add_argument(
        "--sizes", required=True, help="ids per bag, one per feature: 3-2-1-... or 3,2,1,..."
    )
    mh.add_argument("--distribution", default="uniform", choices=("uniform", "pareto"))
    mh.add_argument("--out", type=Path, help="default: beside DIRECTORY, as training looks for it")
    return p


def _multi_hot(args: argparse.Namespace) -> dict:
    from .bag_memory import check_bags
    from .criteo_dataset import CriteoDataset
    from .multi_hot import BLOCK_ROWS, BagSpec, default_directory, materialise

    try:
        sizes = [int(x) for x in args.sizes.replace(",", "-").split("-")]
    except ValueError:
        raise DataError(f"--sizes: expected whole numbers like 3-2-1, got {args.sizes!r}") from None
    tables = CriteoDataset(args.directory).table_sizes
    sizes = sizes * len(tables) if len(sizes) == 1 else sizes
    if len(sizes) == len(tables) and min(sizes) >= 1:  # else BagSpec says what is wrong
        check_bags("--sizes", sizes, BLOCK_ROWS, "materialising the bags")
    spec = BagSpec(sizes, tables, args.distribution, flags=("--sizes", "--distribution"))
    out = materialise(args.directory, args.out or default_directory(args.directory, spec), spec)
    return {"out": str(out), **spec.to_json()}


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C or SIGTERM anywhere: one line saying what is left, exit 130 or 143
    (hybrid_dlrm/common/endings.py); the worker processes leave the decision to this one."""
    args = _parser().parse_args(argv)
    if args.command == "synth" and quick.active():  # the docs' walk (hybrid_dlrm/common/quick.py)
        if args.lines is not None and args.lines > 0:
            args.lines = quick.cap("--lines", args.lines)
        args.test_lines = quick.cap("--test-lines", args.test_lines) if args.test_lines else 0
        if args.layout == "taobao" and args.users > 0:
            args.users = quick.cap("--users", args.users)
        quick.announce("python -m data_pipeline synth")
    if args.command == "preprocess" and quick.active():
        m = args.max_ind_range
        if m is None and args.dataset == "terabyte":
            m = DEFAULT_TERABYTE_MAX_IND_RANGE
        if (m or 0) > 0:  # hash mode: every table has this many rows
            args.max_ind_range = quick.cap("--max-ind-range", m)
            quick.announce("python -m data_pipeline preprocess")
    cli_lines.log_to_stderr("python -m data_pipeline", verbose=args.verbose)
    return endings.run(lambda: _run(args), left=lambda: _left(args))


def _left(args: argparse.Namespace) -> str:
    """What an interrupted command leaves, and how to go on."""
    if args.command == "preprocess" and args.dataset != "taobao":
        return (
            f"the parts finished so far are kept in {args.out}; the same command finishes the rest"
        )
    if args.command == "preprocess":
        return f"{args.out} is not made (no meta.json); the same command makes it"
    if args.command == "multi-hot":
        return "the partial bags were removed; the same command makes them"
    if args.command == "synth":
        return f"the files in {args.out} are incomplete; the same command writes them again"
    return "nothing written"


def _run(args: argparse.Namespace) -> int:
    try:
        _check_out(args)
        if args.command == "preprocess" and args.dataset == "taobao":
            from .taobao import TaobaoOptions, load_taobao_meta, preprocess_taobao

            options = TaobaoOptions(
                ts_length=args.ts_length, points_per_user=args.points_per_user,
                val_fraction=args.val_fraction, test_fraction=args.test_fraction, seed=args.seed,
                on_bad_line=args.on_bad_line, memory_mb=args.memory_mb, block_bytes=args.block_mb << 20,
                progress=False if args.no_progress else None,
            )  # fmt: skip
            meta = load_taobao_meta(preprocess_taobao(args.raw, args.out, options))
            rows = {k: v["rows"] for k, v in meta["splits"].items()}
            print(json.dumps({"out": str(args.out), "rows": rows, "table_sizes": meta["table_sizes"],
                              "bad_lines": meta["bad_lines"]}))  # fmt: skip
        elif args.command == "preprocess":
            options = PreprocessOptions(
                max_ind_range=args.max_ind_range,
                contiguous_ids=args.contiguous_ids,
                frequency_threshold=args.frequency_threshold,
                sub_sample_rate=args.sub_sample_rate,
                seed=args.seed,
                on_bad_line=args.on_bad_line,
                test_raw=args.test_raw,
                workers=args.workers,
                block_bytes=max(args.block_mb, 0) << 20,
                progress=False if args.no_progress else None,
            )
            out = preprocess(args.dataset, args.raw, args.out, options)
            meta = load_meta(out)
            print(
                json.dumps({"out": str(out), "rows": meta["rows"], "bad_lines": meta["bad_lines"]})
            )
        elif args.command == "synth" and args.layout == "taobao":
            print(json.dumps({"written": [str(_synth_taobao(args))]}))
        elif args.command == "synth":
            if args.lines is None or args.lines < 1:
                raise DataError(
                    f"--lines: expected a positive number of lines for --layout {args.layout}"
                )
            spec = SyntheticSpec(seed=args.seed, vocab_cap=args.vocab_cap)
            if args.layout == "kaggle":
                files = write_kaggle(
                    args.out,
                    args.lines,
                    args.test_lines,
                    spec,
                    bad_lines=_bad_lines(args.bad_lines),
                )
                written = [str(f.path) for f in files.values()]
            else:
                gz = [int(d) for d in args.gz_days.split(",") if d.strip()]
                infos = write_terabyte(
                    args.out, args.lines, spec, days=args.days, compressed_days=gz
                )
                written = [str(f.path) for f in infos]
            print(json.dumps({"written": written}))
        elif args.command == "multi-hot":
            print(json.dumps(_multi_hot(args)))
        else:
            print(json.dumps(_info(args.directory), indent=1))
    except DataError as e:  # one style with the parser's own (`python -m X: error: ...`)
        print(f"python -m data_pipeline {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
