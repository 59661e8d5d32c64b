"""`python -m dlrm.report RUN [RUN...] [--out PNG]`: a run's curves as one PNG.

Training loss, test AUC and samples/s over steps, read from each run directory's metrics.jsonl
(the `train`, `eval` and `resume` events the trainer writes); several runs are overlaid, one
colour each, named by their directory with their model, placement (config.json) and final test
AUC (summary.json). The AUC panel has a chance line at 0.5; a resume is a dotted vertical line. A
run evaluated once (the default: at its end) has one AUC point, and the panel says how to get a
curve (`--test-freq N`). The default output is `RUN/curves.png` for one run and `curves.png`
here for several. matplotlib (a dev dependency) draws it with its Agg backend: no display needed.

A run directory without metrics.jsonl, or a line of it that is not a JSON object, is one line
naming the file (and line) and exit code 2; so is a missing matplotlib.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dlrm.run_layout import run_files
from hybrid_dlrm.common import cli_lines
from hybrid_dlrm.common.outputs import Purpose, check_output, png_made_for, png_marker

EXIT_USAGE = 2
# what --out writes (hybrid_dlrm/common/outputs.py): a report PNG of ours is replaced (drawing
# the same run again), anything else needs --overwrite; a run's own files never
REPORT_PNG = Purpose("report PNG", identify=png_made_for("report PNG"))


class ReportError(Exception):
    """Bad input: the message is the one line the command prints."""


@dataclass
class Curves:
    name: str
    loss: list[tuple[int, float]] = field(default_factory=list)
    auc: list[tuple[int, float]] = field(default_factory=list)
    rate: list[tuple[int, float]] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)  # steps a resume continued from
    what: str = ""  # "dlrm, placement hotline", from config.json
    final_auc: float | None = None  # summary.json's

    @property
    def label(self) -> str:
        parts = [self.name] + ([self.what] if self.what else [])
        if self.final_auc is not None:
            parts.append(f"test AUC {self.final_auc:.4f}")
        return ", ".join(parts)


def read_run(run: Path) -> Curves:
    """The curves of one run directory (its metrics.jsonl)."""
    path = run / "metrics.jsonl"
    if not run.is_dir():
        raise ReportError(f"{run}: not a run directory")
    if not path.is_file():
        raise ReportError(f"{run}: no metrics.jsonl (not a run directory, or a run that logged "
                          "nothing yet)")  # fmt: skip
    curves = Curves(str(run), what=_what(run), final_auc=_final_auc(run))
    for n, raw in enumerate(path.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            e = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ReportError(f"{path}:{n}: not a JSON object (a damaged line)") from None
        if not isinstance(e, dict) or not isinstance(e.get("step"), int):
            raise ReportError(f"{path}:{n}: expected a JSON object with an integer step")
        step = e["step"]
        if e.get("event") == "train":
            _add(curves.loss, step, e.get("loss"))
            _add(curves.rate, step, e.get("samples_per_s"))
        elif e.get("event") == "eval":
            _add(curves.auc, step, e.get("test_auc"))
        elif e.get("event") == "resume":
            curves.resumes.append(step)
    return curves


def _json(path: Path) -> dict:
    """A run file's object, or {} where it is missing or damaged: the title is a courtesy, the
    curves are what the report is for."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _what(run: Path) -> str:
    cfg = _json(run / "config.json")
    model, placement = cfg.get("model"), cfg.get("placement")
    parts = [str(model)] if isinstance(model, str) else []
    if isinstance(placement, str):
        parts.append(f"placement {placement}")
    return ", ".join(parts)


def _final_auc(run: Path) -> float | None:
    auc = _json(run / "summary.json").get("test_auc")
    return float(auc) if isinstance(auc, int | float) and auc == auc else None


def _add(points: list, step: int, value) -> None:
    if isinstance(value, int | float) and value == value:  # not NaN
        points.append((step, float(value)))


# why a panel has no point in any run
EMPTY = {
    "loss": "no training-loss point: one is logged every --print-freq steps (256 by default)",
    "auc": "no evaluation yet: at the end of each epoch, or every --test-freq steps",
    "rate": "no samples/s point: one is logged every --print-freq steps (256 by default)",
}


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
                        else None, color=f"C{i}", label=c.label)  # fmt: skip
            for step in c.resumes:
                ax.axvline(step, color=f"C{i}", linestyle=":", linewidth=1)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if not any(getattr(c, attr) for c in runs):  # an empty panel says why, not just blank
            ax.text(0.5, 0.5, EMPTY[attr], transform=ax.transAxes, ha="center", color="grey")
    axes[1].axhline(0.5, color="grey", linestyle="--", linewidth=1)
    axes[1].text(0.01, 0.5, "chance", transform=axes[1].get_yaxis_transform(), color="grey",
                 va="bottom", fontsize="small")  # fmt: skip
    if any(len(c.auc) < 2 for c in runs):
        axes[1].set_title("a run evaluated once is one point: --test-freq N evaluates every N steps",
                          fontsize="small", color="grey")  # fmt: skip
    axes[-1].set_xlabel("step")
    fig.suptitle(runs[0].label if len(runs) == 1 else f"{len(runs)} runs", fontsize="medium")
    if len(runs) > 1:  # every run, also one with no training-loss point (shorter than --print-freq)
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], color=f"C{i}", marker=".", label=c.label) for i, c in enumerate(runs)
        ]
        axes[0].legend(handles=handles, fontsize="small")
    if any(c.resumes for c in runs):
        axes[2].text(0.99, 0.02, "dotted: resumed here", transform=axes[2].transAxes,
                     ha="right", fontsize="small", color="grey")  # fmt: skip
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    from hybrid_dlrm.common.atomic import atomic_write

    with atomic_write(out) as f:
        fig.savefig(f, format="png", dpi=100, metadata=png_marker(REPORT_PNG))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from dlrm.flags import OneLineParser  # one line for a bad flag, as every command says it

    cli_lines.log_to_stderr("python -m dlrm.report")
    p = OneLineParser(prog="python -m dlrm.report", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories")
    p.add_argument("--out", type=Path, help="the PNG (default: RUN/curves.png, or ./curves.png "
                   "for several runs)")  # fmt: skip
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file that is not a report PNG")  # fmt: skip
    a = p.parse_args(argv)
    out = a.out or (a.runs[0] / "curves.png" if len(a.runs) == 1 else Path("curves.png"))
    protected = [item for r in a.runs for item in run_files(r, f"run {r}'s").items()]
    try:
        check_output(out, "--out", REPORT_PNG, protected=protected, overwrite=a.overwrite,
                     error=ReportError)  # fmt: skip
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
    from hybrid_dlrm.common import endings  # Ctrl-C / SIGTERM: one line, exit 130 / 143

    sys.exit(endings.run(main, left=lambda: "nothing written"))  # its writes are atomic
