#!/usr/bin/env bash
# The prepared GPU check (under 5 minutes on one H200): paper-size memory probe for SDP rows with
# torch.cuda.max_memory_allocated next to slimpar's tracker, bf16 autocast; results go to $OUT
# (or docs/results/gpu) for committing.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/gpu}
python3 -m pip install -q -e . >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv || true
timeout 240 python3 -m slimpar.bench.gpu --out "$OUT/134m" --size 134m --batch 8 --seq 1024
