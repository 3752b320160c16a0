#!/usr/bin/env bash
# The SDP x MAPL hybrid's step time and bytes, for two source trees side by side (issue 19: before/after).
# Usage: scripts/hybrid_step_time.sh OLD_TREE NEW_TREE [REPEATS]. Runs alternate (old, new, old, new, ...)
# so machine load hits both alike; prints one line per run: tree, median step time (s), DP bytes/step.
set -euo pipefail
old=$1 new=$2 reps=${3:-3}
out=$(mktemp -d)
args=(--config llama_tiny --parallel.mode pipeline --pipeline.stages 2 --parallel.workers 4 --pipeline.dp sdp
      --pipeline.sdp_keep 0.5 --pipeline.codec mapl --pipeline.microbatches 2 --train.steps 30 --eval.batches 1
      --data.ood none --checkpoint.final false --checkpoint.export false --log.progress false)
for r in $(seq "$reps"); do
  for tree in "$old" "$new"; do
    dir="$out/$(basename "$tree")-$r"
    (cd "$tree" && PYTHONPATH="$tree" PYTHONWARNINGS=ignore python3 -m slimpar train "${args[@]}" --out "$dir" >/dev/null)
    python3 - "$tree" "$dir" <<'PY'
import json, sys
s = json.load(open(sys.argv[2] + "/summary.json"))
ranks = s["per_rank"]
dp = [r.get("hybrid_holder_bytes", 0) + r.get("hybrid_dp_bytes", 0) for r in ranks]
print(f"{sys.argv[1]}\tstep_time_s {s['step_time_s']:.4f}\tdp_bytes/step/rank {sum(dp) / len(dp):.0f}"
      f"\tboundary fwd {s['comm_bytes_per_step_fwd']:.0f} bwd {s['comm_bytes_per_step_bwd']:.0f}")
PY
  done
done
