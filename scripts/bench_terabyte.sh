#!/usr/bin/env bash
# Criteo Terabyte benchmark, reference configurations (facebookresearch/dlrm
# bench/dlrm_s_criteo_terabyte.sh, and with --mlperf the MLPerf one of bench/run_and_time.sh):
# preprocess on first use, then train.
#
#   scripts/bench_terabyte.sh [--mlperf] RAW_DIR [more python -m dlrm.train flags]
#
# RAW_DIR holds day_0 .. day_23 (plain or .gz). Days 0-22 train; day 23 is split into test
# (first half) and validation. Negative training rows are down-sampled with rate 0.875.
#   default:  dim 64, bottom 13-512-256-64, top 512-512-256-1, --max-ind-range 10000000, lr 0.1
#   --mlperf: dim 128, bottom 13-512-256-128, top 1024-1024-512-256-1, --max-ind-range 40000000,
#             lr 1.0, stop at test AUC 0.8025
# Both use batches of 2048. The preprocessed dataset goes to $PROCESSED (default
# data/criteo_terabyte_<M>, one per --max-ind-range), the run to $OUT_DIR. Extra flags come
# last and override the defaults. DRY_RUN=1 prints the command instead.
set -euo pipefail
mlperf=0
if [[ "${1:-}" == "--mlperf" ]]; then
    mlperf=1
    shift
fi
if [[ $# -lt 1 ]]; then
    echo "usage: $0 [--mlperf] RAW_DIR [python -m dlrm.train flags...]" >&2
    exit 2
fi
RAW_DIR=$1
shift
if [[ ! -e "$RAW_DIR/day_0" && ! -e "$RAW_DIR/day_0.gz" ]]; then
    echo "$0: $RAW_DIR/day_0: not found, nor day_0.gz (expected day_0 .. day_23 in RAW_DIR)" >&2
    exit 2
fi
if [[ $mlperf == 1 ]]; then
    rows=40000000
    model=(
        --arch-sparse-feature-size 128
        --arch-mlp-bot 13-512-256-128
        --arch-mlp-top 1024-1024-512-256-1
        --learning-rate 1.0
        --print-freq 2048
        --mlperf-auc-threshold 0.8025
    )
    run=bench_terabyte_mlperf
else
    rows=10000000
    model=(
        --arch-sparse-feature-size 64
        --arch-mlp-bot 13-512-256-64
        --arch-mlp-top 512-512-256-1
        --learning-rate 0.1
        --print-freq 1024
    )
    run=bench_terabyte
fi
cmd=(
    "${PYTHON:-python}" -m dlrm.train
    --data-set terabyte
    --raw-data-file "$RAW_DIR/day"
    --processed-data-file "${PROCESSED:-data/criteo_terabyte_$rows}"
    --max-ind-range "$rows"
    --data-sub-sample-rate 0.875
    --arch-interaction-op dot
    "${model[@]}"
    --mini-batch-size 2048
    --test-mini-batch-size 16384
    --optimizer sgd
    --nepochs 1
    --test-freq 102400
    --out-dir "${OUT_DIR:-runs/$run}"
    "$@"
)
if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
exec "${cmd[@]}"
