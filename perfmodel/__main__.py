"""`python -m perfmodel microbench|fit|predict|plan|report`: the performance model's command line.

    python -m perfmodel microbench --out perf/bench        # hardware + kernel sweeps + fit traces
    python -m perfmodel fit --bench perf/bench              # -> the machine's perfmodel.json
    python -m perfmodel predict --mini-batch-size 4096 --precision bf16 --arch-mlp-bot 13-512-256-64-16
    python -m perfmodel plan --memory-limit 20GB --data-size 409600   # --placement auto's table
    python -m perfmodel report --out perf/report --json     # predicted vs measured, held out
    python -m perfmodel report --from-traces perf/report    # the same measurements, another model

`predict` and `plan` take the trainer's own flags (everything `python -m dlrm.train` accepts). `--threads`
fixes the intra-op thread count of every measurement and prediction (a model is per thread
count); on a machine shared with other processes one thread gives far steadier numbers than an
OpenMP team that waits on a descheduled thread. A user's mistake ends with one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from dlrm.settings.sections import THREADS_MAX
from hybrid_dlrm.common import cli_lines, endings

EXIT_USAGE = 2
PROG = "python -m perfmodel"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _set_threads(n: int | None) -> None:
    """Before torch/numba start their pools: numba's OpenMP layer otherwise resets torch's
    thread count to its own after the first synthetic chunk."""
    if n is None:
        return
    if not 1 <= n <= THREADS_MAX:  # SystemExit(str) exits 1: a flag mistake is 2
        sys.stderr.write(f"{PROG}: error: --threads: expected 1 to {THREADS_MAX} (4 per CPU of "
                         f"this machine), got {n}\n")  # fmt: skip
        raise SystemExit(EXIT_USAGE)
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["NUMBA_NUM_THREADS"] = str(n)
    import torch

    torch.set_num_threads(n)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True

    def common(sp) -> None:
        sp.add_argument(
            "--threads", type=int, default=None, help="intra-op threads (default: torch's)"
        )
        sp.add_argument(
            "--model",
            dest="model_path",
            default=None,
            help="perfmodel.json (default: this machine's cached one)",
        )
        sp.add_argument("-v", "--verbose", action="store_true")

    mb = sub.add_parser(
        "microbench", help="measure the hardware, sweep the kernels, trace the fit configurations"
    )
    common(mb)
    mb.add_argument("--out", required=True, help="directory for kernels.jsonl and traces/")
    mb.add_argument("--scale", type=float, default=1.0, help="multiply the number of swept shapes")
    mb.add_argument("--reps", type=int, default=5)
    mb.add_argument("--seed", type=int, default=0)
    mb.add_argument(
        "--sweeps",
        default=None,
        help="comma-separated subset of gemm,mlp,interaction,embedding,elementwise,loss,copy",
    )
    mb.add_argument("--no-fit-configs", action="store_true", help="skip the training traces")
    mb.add_argument(
        "--refresh-hardware", action="store_true", help="re-measure the hardware description"
    )

    fit = sub.add_parser("fit", help="fit kernel models and overheads; write perfmodel.json")
    common(fit)
    fit.add_argument("--bench", required=True, help="a microbench output directory")
    fit.add_argument(
        "--traces", nargs="*", default=[], help="more perf traces (files or directories)"
    )
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--overwrite", action="store_true",
                     help="replace an existing --model file that is not a performance model")  # fmt: skip

    pr = sub.add_parser(
        "predict", help="predict the per-batch time of a configuration (trainer flags)"
    )
    common(pr)
    pr.add_argument("--json", action="store_true", help="print one JSON object")

    pl = sub.add_parser(
        "plan", help="the placement --placement auto would choose, and why (trainer flags)"
    )
    # not `common`: its --model (perfmodel.json) would take the trainer's --model dlrm|tbsm
    pl.add_argument("--threads", type=int, default=None, help="intra-op threads")
    pl.add_argument("-v", "--verbose", action="store_true")
    pl.add_argument("--json", action="store_true", help="print the decision as one JSON object")

    rep = sub.add_parser("report", help="predicted vs measured on held-out configurations")
    common(rep)
    rep.add_argument(
        "--out", default="runs/perfmodel-report", help="directory for report.json and report.png"
    )
    rep.add_argument("--json", action="store_true", help="print one JSON object")
    rep.add_argument("--steps", type=int, default=11, help="timed steps per configuration")
    rep.add_argument(
        "--quick",
        action="store_true",
        help="a few small configurations only (with --dcn: the first dot configuration "
        "and its DCN partners)",
    )
    rep.add_argument(
        "--dcn", action="store_true",
        help="measure dot configurations next to the same ones with DCN interactions instead",
    )  # fmt: skip
    rep.add_argument(
        "--from-traces", metavar="DIR", default=None,
        help="score the traces of an earlier report in DIR with the model (measure nothing)",
    )  # fmt: skip
    rep.add_argument(
        "--passes", type=_positive_int, default=1,
        help="measure every configuration this many times, in rounds (median; with 2 or more the "
        "report has the measurement's own repeatability)",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C or SIGTERM anywhere: one line, exit 130 or 143 (hybrid_dlrm/common/endings.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in ("predict", "plan"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    _walk_sizes(args)
    return endings.run(lambda: _main(args, rest), left=lambda: _left(args))


def _left(args) -> str:
    """What an interrupted command leaves."""
    if args.command == "microbench":
        return f"{args.out} holds the measurements made so far, not a complete bench"
    if args.command == "report" and not args.from_traces:
        return f"{args.out} holds the measurements made so far, not a report"
    return "nothing written"


def _main(args, rest: list[str]) -> int:
    cli_lines.log_to_stderr(PROG)  # warnings as `{prog}: warning: ...`
    logging.getLogger("perfmodel").setLevel(logging.INFO if args.verbose else logging.WARNING)
    _set_threads(args.threads)
    from dlrm.trainer import set_flush_denormal

    # as the trainer runs, and before any thread pool starts (workers inherit the setting): the
    # microbenchmarks then time the kernels the training steps run
    set_flush_denormal(True)

    from data_pipeline.errors import DataError
    from dlrm.config import ConfigError
    from perfmodel.errors import ModelError, TraceError

    try:
        _check_out(args, ConfigError)
        if args.command == "microbench":
            return _microbench(args)
        if args.command == "fit":
            return _fit(args)
        if args.command == "predict":
            return _predict(args, rest)
        if args.command == "plan":
            return _plan(args, rest)
        return _report(args)
    except (ConfigError, DataError, ModelError, TraceError) as e:
        sys.stderr.write(f"{PROG} {args.command}: error: {e}\n")
        return EXIT_USAGE


def _walk_sizes(args) -> None:
    """HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py): a few shapes, one repetition, a few
    held-out configurations of a few steps, one pass."""
    from hybrid_dlrm.common import quick

    if not quick.active():
        return
    if args.command == "microbench":
        args.scale = quick.cap_scale("--scale", args.scale)
        args.reps = quick.cap("--reps", args.reps)
        args.fit_count = quick.cap("fit traces", 0)
    if args.command == "report" and not args.from_traces:
        args.steps = quick.cap("--steps", args.steps)
        args.passes = quick.cap("--passes", args.passes)
        if not args.quick:
            quick.note("--quick")
            args.quick = True
    quick.announce(f"{PROG} {args.command}")


def _check_out(args, error: type[Exception]) -> None:
    """What the command writes, against the output rule (hybrid_dlrm/common/outputs.py), before
    anything is measured: a directory of ours (its microbench.json, report.json) is written
    again; `fit`'s model replaces a performance model, anything else with --overwrite."""
    from hybrid_dlrm.common.outputs import Purpose, check_output, json_format_is

    if args.command == "microbench":
        bench = Purpose("microbenchmark directory", directory=True,
                        identify=lambda d: (d / "microbench.json").is_file())  # fmt: skip
        check_output(args.out, "--out", bench, error=error)
    elif args.command == "report" and not args.from_traces:
        report = Purpose("performance report directory", directory=True,
                         identify=lambda d: (d / "report.json").is_file())  # fmt: skip
        check_output(args.out, "--out", report, error=error)
    elif args.command == "fit":
        from perfmodel.model import FORMAT, default_model_path

        model = Purpose("performance model", identify=json_format_is(FORMAT))
        inputs = [("--bench", args.bench), *(("--traces", t) for t in args.traces)]
        check_output(args.model_path or default_model_path(), "--model", model, protected=inputs,
                     overwrite=args.overwrite, error=error)  # fmt: skip


def _microbench(args) -> int:
    from perfmodel import hardware, microbench
    from perfmodel.sweeps import SWEEPS

    names = args.sweeps.split(",") if args.sweeps else None
    unknown = [s for s in names or [] if s not in SWEEPS]
    if unknown:
        sys.stderr.write(f"{PROG} microbench: error: --sweeps: unknown {', '.join(unknown)}; "
                         f"expected some of {', '.join(SWEEPS)}\n")  # fmt: skip
        return EXIT_USAGE
    # a calibration's quick description is not the full microbenchmark's
    hw = hardware.describe(refresh=args.refresh_hardware or bool(hardware.describe().get("quick")))
    summary = microbench.run(args.out, scale=args.scale, reps=args.reps, seed=args.seed, sweeps=names,
                             fit_configs=not args.no_fit_configs,
                             fit_count=getattr(args, "fit_count", None))  # fmt: skip
    summary["hardware_description"] = {k: v for k, v in hw.items() if k != "read_bw_sweep"}
    print(json.dumps(summary, indent=2))
    return 0


def _fit(args) -> int:
    from perfmodel.model import PerfModel, default_model_path

    model = PerfModel.fit(args.bench, args.traces, seed=args.seed)
    path = model.save(args.model_path or default_model_path())
    print(json.dumps({"model": str(path), **model.fit_info}, indent=2))
    return 0


def _predict(args, rest: list[str]) -> int:
    from dlrm.train import build_parser as train_parser
    from perfmodel.model import predict_step_time

    cfg_args = vars(train_parser().parse_args(rest))
    from dlrm.config import TrainConfig

    cfg = TrainConfig(**cfg_args)
    out = predict_step_time(cfg, model_path=args.model_path)
    if args.json:
        print(json.dumps(out))
    else:
        b = out["breakdown"]
        print(f"predicted per-batch time: {out['per_batch_us'] / 1e3:.3f} ms  (batch {out['batch_size']}, "
              f"{cfg.training.precision}, {out['ops']} ops, {out['kernels']} kernels)")  # fmt: skip
        print(
            f"  device active: {out['device_active_total_us'] / 1e3:.3f} ms; host overheads: "
            + ", ".join(f"{k} {v / 1e3:.3f} ms" for k, v in b["overhead_us"].items())
        )
        print("  by phase: " + ", ".join(f"{k} {v / 1e3:.3f} ms" for k, v in b["phase_us"].items()))
        print(
            "  by kernel type: "
            + ", ".join(f"{k} {v / 1e3:.3f} ms" for k, v in sorted(b["kernel_type_us"].items()))
        )
    return 0


def _plan(args, rest: list[str]) -> int:
    """The decision `--placement auto` makes for the trainer's flags in `rest`, without training
    (the data's batches are read for the profile; nothing is written)."""
    from dlrm.build import resolve_device
    from dlrm.config import TrainConfig
    from dlrm.data import build_data
    from dlrm.placement.auto import Planner
    from dlrm.placement.candidates import KindPredictor
    from dlrm.train import build_parser as train_parser

    flags = train_parser()
    flags.prog = f"{PROG} plan"  # its one-line errors name this command
    cfg_args = vars(flags.parse_args(rest))
    cfg_args["placement"] = "auto"  # what auto would choose, whatever placement the flags name
    cfg = TrainConfig(**cfg_args)
    from perfmodel.placement_costs import PlacementCosts

    planner = Planner(predictor=KindPredictor(PlacementCosts()))
    decision = planner.plan(cfg, build_data(cfg), resolve_device(cfg.training.device), write=False)
    print(json.dumps(decision.to_json()) if args.json else decision.table())
    return 0


def _report(args) -> int:
    from perfmodel import report

    if args.from_traces:
        result = report.rescore(args.from_traces, model_path=args.model_path)
    else:
        result = report.run(
            args.out,
            model_path=args.model_path,
            steps=args.steps,
            quick=args.quick,
            passes=args.passes,
            dcn=args.dcn,
        )
    if args.json:
        print(json.dumps(result))
    else:
        print(report.format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
