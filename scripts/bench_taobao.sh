#!/usr/bin/env bash
# Taobao UserBehavior benchmark, reference TBSM configuration (facebookresearch/tbsm
# bench/tbsm_bench.sh): dim 16, bottom 1-16, top 15-15, tsl-mlp 15-15, arch-mlp 60-1,
# ts-length 20, tsl def/mlp, batch 256, Adagrad lr 0.05, 1 epoch. Then, with the same data and
# budget, the baseline TBSM must beat: a DLRM on the candidate step alone (top 15-1).
#
#   scripts/bench_taobao.sh RAW [more python -m dlrm.train flags]
#
# RAW is UserBehavior.csv (no header). The window dataset is made on first use in $PROCESSED
# (default data/taobao_t20) and reused after; runs go to $OUT_DIR/{tbsm,dlrm} (default
# runs/bench_taobao). Extra flags come last and override the defaults (for both runs), e.g.
# --num-batches 2000 or --model-type mha. The last line is JSON: both test AUCs and the gap.
# DRY_RUN=1 prints the commands instead. ONLY=tbsm skips the baseline.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 RAW [python -m dlrm.train flags...]" >&2
    exit 2
fi
RAW=$1
shift
if [[ -z "${DRY_RUN:-}" && ! -f "$RAW" ]]; then  # a dry run needs no data
    echo "$0: $RAW: not found (expected Taobao's UserBehavior.csv)" >&2
    exit 2
fi
PY=${PYTHON:-python}
OUT=${OUT_DIR:-runs/bench_taobao}
common=(
    --data-set taobao
    --raw-data-file "$RAW"
    --processed-data-file "${PROCESSED:-data/taobao_t20}"
    --ts-length 20
    --points-per-user 10
    --arch-sparse-feature-size 16
    --arch-mlp-bot 1-16
    --arch-interaction-op dot
    --mini-batch-size 256
    --test-mini-batch-size 4096
    --optimizer adagrad
    --learning-rate 0.05
    --nepochs 1
    --print-freq 100
    --numpy-rand-seed 123
)
tbsm=("$PY" -m dlrm.train --model tbsm "${common[@]}" --arch-mlp-top 15-15 --model-type tsl
      --tsl-inner def --tsl-mechanism mlp --tsl-num-heads 1 --tsl-mlp 15-15 --arch-mlp 60-1
      --out-dir "$OUT/tbsm" "$@")
dlrm=("$PY" -m dlrm.train --model dlrm "${common[@]}" --arch-mlp-top 15-1 --out-dir "$OUT/dlrm" "$@")
if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "${tbsm[@]}"; echo
    printf '%q ' "${dlrm[@]}"; echo
    exit 0
fi
"${tbsm[@]}"
if [[ "${ONLY:-}" != "tbsm" ]]; then
    "${dlrm[@]}"
fi
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
auc = {k: json.loads((out / k / "summary.json").read_text())["test_auc"]
       for k in ("tbsm", "dlrm") if (out / k / "summary.json").is_file()}
gap = auc["tbsm"] - auc["dlrm"] if len(auc) == 2 else None
print(json.dumps({"tbsm_test_auc": auc.get("tbsm"), "dlrm_candidate_test_auc": auc.get("dlrm"), "gap": gap}))
PYEOF
