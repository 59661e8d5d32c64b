#!/usr/bin/env bash
# Criteo Kaggle benchmark, reference configuration (facebookresearch/dlrm
# bench/dlrm_s_criteo_kaggle.sh): preprocess on first use, then train one epoch.
#
#   scripts/bench_kaggle.sh RAW_DIR [more python -m dlrm.train flags]
#
# RAW_DIR holds Kaggle's train.txt (from dac.tar.gz). The preprocessed dataset is written to
# $PROCESSED (default data/criteo_kaggle) on the first run and reused after; the run goes to
# $OUT_DIR (default runs/bench_kaggle). Extra flags come last and so override the defaults,
# e.g. --num-batches 1000 or --data-randomize day. DRY_RUN=1 prints the command instead.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 RAW_DIR [python -m dlrm.train flags...]" >&2
    exit 2
fi
RAW_DIR=$1
shift
if [[ -z "${DRY_RUN:-}" && ! -f "$RAW_DIR/train.txt" ]]; then  # a dry run needs no data
    echo "$0: $RAW_DIR/train.txt: not found (expected Kaggle's train.txt in RAW_DIR)" >&2
    exit 2
fi
cmd=(
    "${PYTHON:-python}" -m dlrm.train
    --data-set kaggle
    --raw-data-file "$RAW_DIR/train.txt"
    --processed-data-file "${PROCESSED:-data/criteo_kaggle}"
    --arch-sparse-feature-size 16
    --arch-mlp-bot 13-512-256-64-16
    --arch-mlp-top 512-256-1
    --arch-interaction-op dot
    --mini-batch-size 128
    --test-mini-batch-size 16384
    --learning-rate 0.1
    --optimizer sgd
    --nepochs 1
    --test-freq 1024
    --print-freq 1024
    --out-dir "${OUT_DIR:-runs/bench_kaggle}"
    "$@"
)
if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
exec "${cmd[@]}"
