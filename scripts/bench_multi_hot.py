"""Multi-hot data against one-hot, in one process, interleaved (prints JSON):

- the synthetic generator: samples/s and ids/s of the one-hot kernel and the bag kernel with
  MLPerf's sizes (214 ids a sample against 26), on Kaggle-shaped tables at 1%;
- the materialisation: rows/s and MB/s written, from a generated preprocessed Kaggle directory;
- the loader: shuffled batches/s of CriteoBatchSource one-hot, from the materialised bags, and
  making the bags as each batch is loaded (`--multi-hot-materialize false`).

    python scripts/bench_multi_hot.py [--rounds 3] [--threads 1] [--rows 400000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _shared import cpu_flags, load_average  # noqa: E402

from data_pipeline.criteo import CriteoBatchSource, CriteoDataset, PreprocessOptions, preprocess  # noqa: E402
from data_pipeline.multi_hot import BagSpec, MultiHotDataset, materialise  # noqa: E402
from data_pipeline.synthetic import (  # noqa: E402
    CHUNK,
    PlantedWorld,
    SyntheticConfig,
    scaled_table_sizes,
)
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle  # noqa: E402
from dlrm.config import MLPERF_DCNV2_MULTI_HOT as SIZES  # noqa: E402
from hybrid_dlrm.common.machine import cpu_model  # noqa: E402


def _rate(fn, n_items: int, repeat: int) -> float:
    fn()  # warm: compiled kernels, page cache
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return n_items * repeat / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=400_000, help="rows of the generated Kaggle set")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tables = scaled_table_sizes(0.01)
    worlds = {
        "one_hot": PlantedWorld(SyntheticConfig(table_sizes=tables)),
        "multi_hot": PlantedWorld(SyntheticConfig(table_sizes=tables, multi_hot_sizes=list(SIZES))),
    }
    gen = {k: [] for k in worlds}
    for _ in range(args.rounds):  # interleaved: a neighbour's load hits both alike
        for name, world in worlds.items():
            gen[name].append(_rate(lambda w=world: w.chunk("train", 1), CHUNK, 8))
    ids = {"one_hot": 26, "multi_hot": sum(SIZES)}
    generator = {
        k: {"samples_per_s": round(max(v)), "ids_per_s": round(max(v) * ids[k])}
        for k, v in gen.items()
    }

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_kaggle(tmp / "raw", args.rows, 25, SyntheticSpec(seed=1))
        source = preprocess(
            "kaggle", tmp / "raw", tmp / "kaggle", PreprocessOptions(max_ind_range=10**6)
        )
        ds = CriteoDataset(source)
        spec = BagSpec(list(SIZES), ds.table_sizes)
        t = time.perf_counter()
        out = materialise(source, tmp / "bags", spec)
        seconds = time.perf_counter() - t
        rows = sum(p["rows"] for p in ds.meta["parts"])
        written = sum(f.stat().st_size for f in out.iterdir())
        bags = MultiHotDataset(out)
        sources = {
            "one_hot": CriteoBatchSource(ds, "train", 2048, randomize="total", prefetch=0),
            "multi_hot": CriteoBatchSource(
                ds, "train", 2048, randomize="total", prefetch=0, bags=bags
            ),
            # --multi-hot-materialize false: the same bags, made as each batch is loaded
            "multi_hot_made_as_loaded": CriteoBatchSource(
                ds, "train", 2048, randomize="total", prefetch=0, bags=spec
            ),
        }
        load = {k: [] for k in sources}
        for _ in range(args.rounds):
            for name, src in sources.items():
                load[name].append(_rate(lambda s=src: [s.batch(0, i) for i in range(8)], 8, 2))
    print(json.dumps({
        "generator": generator,
        "materialisation": {"rows": rows, "seconds": round(seconds, 2),
                            "rows_per_s": round(rows / seconds), "mb_per_s": round(written / seconds / 1e6, 1),
                            "bytes_per_row": round(written / rows)},
        "loader_batches_per_s_2048_shuffled": {k: round(max(v), 1) for k, v in load.items()},
        "threads": args.threads, "rounds": args.rounds, "cpu": cpu_model(),
        "cpu_flags": cpu_flags(), "load_average": load_average(),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
