#!/usr/bin/env bash
# Criteo Terabyte benchmark, reference configurations (facebookresearch/dlrm
# bench/dlrm_s_criteo_terabyte.sh; with --mlperf the MLPerf one of bench/run_and_time.sh, the
# retired dot benchmark; with --mlperf-dcnv2 MLPerf's DLRM-DCNv2, the benchmark since 2023, whose
# reference is torchrec's DLRM example): preprocess on first use, then train.
#
#   scripts/bench_terabyte.sh [--mlperf | --mlperf-dcnv2] RAW_DIR [more python -m dlrm.train flags]
#   scripts/bench_terabyte.sh --mlperf-dcnv2-small [more python -m dlrm.train flags]
#
# RAW_DIR holds day_0 .. day_23 (plain or .gz). Days 0-22 train; day 23 is split into test
# (first half) and validation. Negative training rows are down-sampled with rate 0.875.
#   default:  dim 64, bottom 13-512-256-64, top 512-512-256-1, --max-ind-range 10000000, lr 0.1
#   --mlperf: dim 128, bottom 13-512-256-128, top 1024-1024-512-256-1, --max-ind-range 40000000,
#             lr 1.0, stop at test AUC 0.8025
#   --mlperf-dcnv2: dim 128, bottom 13-512-256-128, DCNv2 interaction (3 cross layers, rank
#             512), top 1024-1024-512-256-1, --max-ind-range 40000000 --contiguous-ids (each
#             feature's values % M renumbered, as MLPerf's preprocessing: on the real days the
#             26 tables of dlrm/recipes/terabyte-dcn.toml, ~104 GB of fp32 weights), Adagrad (its
#             per-element state doubles that), lr 0.004, batches of 65536, stop at test AUC
#             0.80275, every training row kept (no negative down-sampling: its own dataset,
#             data/criteo_terabyte_40000000_full). Placement: `device` where the weights and
#             state fit in 80% of this machine's memory ($MEM_KB overrides /proc/meminfo), else the SSD tier (`--placement tiered --scm-dir $SCM_DIR`,
#             default data/scm_dcnv2; hot rows in $HOT_BUDGET, default 2GB, a DRAM row cache of
#             $SCM_CACHE, default 4GB). MLPerf's multi-hot bags (--multi-hot-sizes
#             3-2-1-2-6-1-1-1-1-7-3-8-1-6-9-5-1-1-1-12-100-27-10-3-1-1, uniform: 214 ids a
#             sample), materialised once from the preprocessed days beside them
#             ($PROCESSED.multihot-uniform-<tag>, docs/data.md#multi-hot-bags: about 0.86 KB a
#             row, some 3.7 TB for the 4.37 billion rows, as MLPerf's own files).
#   --mlperf-dcnv2-small: the scaled-down variant that fits a laptop (no RAW_DIR): the same
#             model, optimizer and bag sizes on the synthetic planted click model (multi-hot:
#             it pools each bag's rows), MLPerf's tables capped at 100,000 rows (921,198 rows,
#             ~0.94 GB of weights with Adagrad's state), batches of 2048, 1M training samples,
#             lr 0.004 (Adagrad's first step moves every dense weight by the rate: at 0.02 this
#             model's loss reaches 1e6 within 2 steps).
# The dot configurations use batches of 2048. The preprocessed dataset goes to $PROCESSED
# (default data/criteo_terabyte_<M>, one per --max-ind-range), the run to $OUT_DIR. Extra flags
# come last and override the defaults. DRY_RUN=1 prints the command instead.
set -euo pipefail
mode=default
case "${1:-}" in
    --mlperf) mode=mlperf; shift ;;
    --mlperf-dcnv2) mode=dcnv2; shift ;;
    --mlperf-dcnv2-small) mode=dcnv2_small; shift ;;
esac
dcnv2_model=(
    --arch-sparse-feature-size 128
    --arch-mlp-bot 13-512-256-128
    --arch-mlp-top 1024-1024-512-256-1
    --arch-interaction-op dcn
    --dcn-num-layers 3
    --dcn-low-rank-dim 512
    --optimizer adagrad
    --multi-hot-sizes 3-2-1-2-6-1-1-1-1-7-3-8-1-6-9-5-1-1-1-12-100-27-10-3-1-1
    --multi-hot-distribution uniform
)
if [[ $mode == dcnv2_small ]]; then
    # MLPerf's 26 tables capped at 100,000 rows (as preprocessing with --max-ind-range 100000):
    # the long bags stay on the large tables, whose small initial rows keep the summed bags and
    # the cross layers in range (Kaggle's shapes at 1% put bags of 27 on a 2-row table: the
    # loss went to 1e3 within 4 steps)
    small_tables=100000-39060-17295-7424-20265-3-7122-1543-63-100000-100000-100000-10-2209-11938-155-4-976-14-100000-100000-100000-100000-12973-108-36
    cmd=(
        "${PYTHON:-python}" -m dlrm.train
        --data-set synthetic
        --arch-embedding-size "$small_tables"
        --data-size 1048576
        --test-data-size 131072
        "${dcnv2_model[@]}"
        --learning-rate 0.004
        --mini-batch-size 2048
        --test-mini-batch-size 16384
        --nepochs 1
        --print-freq 64
        --test-freq 256
        --out-dir "${OUT_DIR:-runs/bench_terabyte_mlperf_dcnv2_small}"
        "$@"
    )
    if [[ -n "${DRY_RUN:-}" ]]; then
        printf '%q ' "${cmd[@]}"
        echo
        exit 0
    fi
    exec "${cmd[@]}"
fi
if [[ $# -lt 1 ]]; then
    echo "usage: $0 [--mlperf | --mlperf-dcnv2] RAW_DIR [python -m dlrm.train flags...]" >&2
    echo "       $0 --mlperf-dcnv2-small [python -m dlrm.train flags...]" >&2
    exit 2
fi
RAW_DIR=$1
shift
if [[ -z "${DRY_RUN:-}" && ! -e "$RAW_DIR/day_0" && ! -e "$RAW_DIR/day_0.gz" ]]; then  # a dry run needs no data
    echo "$0: $RAW_DIR/day_0: not found, nor day_0.gz (expected day_0 .. day_23 in RAW_DIR)" >&2
    exit 2
fi
placement=()
batch=2048
sub_sample=0.875
test_freq=102400
processed_suffix=
if [[ $mode == dcnv2 ]]; then
    rows=40000000
    batch=65536
    # every training row (torchrec's preprocessing keeps the negatives): a dataset of its own
    sub_sample=0.0
    processed_suffix=_full
    test_freq=3200  # about 20 evaluations in the epoch, as the reference's validation_freq
    model=(
        "${dcnv2_model[@]}"
        --learning-rate 0.004
        --print-freq 64
        --mlperf-auc-threshold 0.80275
        --contiguous-ids
    )
    # MLPerf's 204,184,588 renumbered rows x 128 x 4 bytes, twice (Adagrad's state is per element)
    need_kb=$((204184588 * 128 * 4 * 2 / 1024))
    mem_kb=${MEM_KB:-$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)}
    if ((need_kb > mem_kb * 8 / 10)); then
        placement=(
            --placement tiered
            --scm-dir "${SCM_DIR:-data/scm_dcnv2}"
            --hot-budget "${HOT_BUDGET:-2GB}"
            --scm-cache "${SCM_CACHE:-4GB}"
        )
    fi
    run=bench_terabyte_mlperf_dcnv2
elif [[ $mode == mlperf ]]; then
    rows=40000000
    model=(
        --arch-sparse-feature-size 128
        --arch-mlp-bot 13-512-256-128
        --arch-mlp-top 1024-1024-512-256-1
        --arch-interaction-op dot
        --optimizer sgd
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
        --arch-interaction-op dot
        --optimizer sgd
        --learning-rate 0.1
        --print-freq 1024
    )
    run=bench_terabyte
fi
cmd=(
    "${PYTHON:-python}" -m dlrm.train
    --data-set terabyte
    --raw-data-file "$RAW_DIR/day"
    --processed-data-file "${PROCESSED:-data/criteo_terabyte_$rows$processed_suffix}"
    --max-ind-range "$rows"
    --data-sub-sample-rate "$sub_sample"
    "${model[@]}"
    "${placement[@]}"
    --mini-batch-size "$batch"
    --test-mini-batch-size 16384
    --nepochs 1
    --test-freq "$test_freq"
    --out-dir "${OUT_DIR:-runs/$run}"
    "$@"
)
if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
exec "${cmd[@]}"
