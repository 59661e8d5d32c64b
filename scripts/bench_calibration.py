"""How long the planner's calibration takes at a run's shapes (issue 44: under 30 s on 2 cores).

    python scripts/bench_calibration.py                        # the default run's shapes
    python scripts/bench_calibration.py -- --data-set terabyte --arch-interaction-op dcn \
        --processed-data-file none        # the MLPerf DCNv2 shapes (the directory is not read)

Builds the run's config from dlrm.train's flags (after `--`; no data is read), then calibrates
twice in a fresh cache directory: once from nothing (the machine-wide figures measured too) and
once from the cache it wrote. Prints one JSON object: each pass's seconds and its phases, the
calibration's own counts, the load average and the CPU flags.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _shared import cpu_flags, load_average  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="bench_calibration.py", description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=None, help="seconds (default: the planner's)")
    args = p.parse_args(own)
    with tempfile.TemporaryDirectory(prefix="calibration-") as cache:
        os.environ["HYBRID_DLRM_CACHE"] = cache  # read when the calibration looks for its file
        os.environ.pop("HYBRID_DLRM_CALIBRATE", None)
        from data_pipeline.synthetic import scaled_table_sizes
        from dlrm.config import TrainConfig
        from dlrm.errors import ConfigError
        from dlrm.train import build_parser
        from perfmodel import calibration
        from perfmodel.model import PerfModel

        try:
            cfg = TrainConfig(**vars(build_parser().parse_args(flags)))
        except ConfigError as e:
            sys.stderr.write(f"{p.prog}: error: {e}\n")
            return 2
        sizes = list(cfg.arch.embedding_size or scaled_table_sizes(cfg.data.synthetic_table_scale))
        passes = []
        for name in ("from nothing", "from its cache"):
            t0 = time.perf_counter()
            kw = {} if args.budget is None else {"seconds": args.budget}
            model = calibration.model_for(cfg, sizes, PerfModel, **kw)
            passes.append({"pass": name, "seconds": round(time.perf_counter() - t0, 2)})
        print(json.dumps({"flags": flags, "table_rows": sum(sizes), "passes": passes,
                          "calibration": model.fit_info.get("calibration_run"),
                          "load_average": load_average(), "cpu_flags": cpu_flags()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
