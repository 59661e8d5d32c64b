"""`python -m dlrm.report RUN [RUN...] [--out PNG]`: a run's curves as one PNG.

Training loss, test AUC and samples/s over steps, read from each run directory's metrics.jsonl
(the `train` and `eval` events the trainer writes); several runs are overlaid, one colour each,
named by their directory. The default output is `RUN/curves.png` for one run and `curves.png`
here for several. matplotlib (a dev dependency) draws it with its Agg backend: no display needed.

A run directory without metrics.jsonl, or a line of it that is not a JSON object, is one line
naming the file (and line) and exit code 2; so is a missing matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

EXIT_USAGE = 2


class ReportError(Exception):
    """Bad input: the message is the one line the command prints."""


@dataclass
class Curves:
    name: str
    loss: list[tuple[int, float]] = field(default_factory=list)
    auc: list[tuple[int, float]] = field(default_factory=list)
    rate: list[tuple[int, float]] = field(default_factory=list)


def read_run(run: Path) -> Curves:
    """The curves of one run directory (its metrics.jsonl)."""
    path = run / "metrics.jsonl"
    if not run.is_dir():
        raise ReportError(f"{run}: not a run directory")
    if not path.is_file():
        raise ReportError(f"{run}: no metrics.jsonl (not a run directory, or a run that logged "
                          "nothing yet)")  # fmt: skip
    curves = Curves(str(run))
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            raise ReportError(f"{path}:{n}: not a JSON object (a damaged line)") from None
        if not isinstance(e, dict) or not isinstance(e.get("step"), int):
            raise ReportError(f"{path}:{n}: expected a JSON object with an integer step")
        step = e["step"]
        if e.get("event") == "train":
            _add(curves.loss, step, e.get("loss"))
            _add(curves.rate, step, e.get("samples_per_s"))
        elif e.get("event") == "eval":
            _add(curves.auc, step, e.get("test_auc"))
    return curves


def _add(points: list, step: int, value) -> None:
    if isinstance(value, int | float) and value == value:  # not NaN
        points.append((step, float(value)))


def draw(runs: list[Curves], out: Path) -> None:
    """The three panels, every run overlaid, written to `out` as PNG."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(
            "matplotlib is not installed (a dev dependency: pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")  # files only, whatever display there is
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    panels = (("training loss", "loss"), ("test AUC", "auc"), ("samples/s", "rate"))
    for ax, (title, attr) in zip(axes, panels):
        for i, c in enumerate(runs):  # one colour per run in every panel, whichever it misses
            pts = getattr(c, attr)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30
                        else None, color=f"C{i}", label=c.name)  # fmt: skip
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step")
    if len(runs) > 1:  # every run, also one with no training-loss point (shorter than --print-freq)
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], color=f"C{i}", marker=".", label=c.name) for i, c in enumerate(runs)
        ]
        axes[0].legend(handles=handles, fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    from hybrid_dlrm.common.atomic import atomic_write

    with atomic_write(out) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlrm.report", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories")
    p.add_argument("--out", type=Path, help="the PNG (default: RUN/curves.png, or ./curves.png "
                   "for several runs)")  # fmt: skip
    a = p.parse_args(argv)
    out = a.out or (a.runs[0] / "curves.png" if len(a.runs) == 1 else Path("curves.png"))
    try:
        runs = [read_run(r) for r in a.runs]
        draw(runs, out)
    except ReportError as e:
        sys.stderr.write(f"python -m dlrm.report: error: {e}\n")
        return EXIT_USAGE
    except OSError as e:
        sys.stderr.write(f"python -m dlrm.report: error: {out}: {e.strerror or e}\n")
        return EXIT_USAGE
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
