#!/usr/bin/env bash
# The prepared device check: `slimpar bench gpu` on one GPU, at most 4 minutes by its rows' own time limits
# (benchmarks/gpu_check.py lists them: NCCL under torchrun with a DCP resume, virtual and batched SDP, 4 ranks
# on one GPU over cuda:gloo, the virtual pipeline with MAPL + RVQ and SSN in bf16, torch.compile with inductor,
# CUDA peak memory at 134M against `slimpar plan --memory`, SPEL with TF32 on). A row that fails is recorded and
# the next one runs; results.json is rewritten after every row.
#
# Nothing is installed there and nothing can be fetched: slimpar runs from this checkout (PYTHONPATH) with the
# image's torch, and trains on a corpus made of slimpar's own source (no data package needed).
# The speed part (slimpar bench throughput at 134M and 1B, its own 8 minutes) is a second call: --rows speed.
#   device run: bash scripts/gpu_check.sh            (results in $OUT, default docs/results/gpu)
#               OUT=docs/results/gpu/speed bash scripts/gpu_check.sh --rows speed
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/gpu}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SLIMPAR_CACHE="${SLIMPAR_CACHE:-/tmp/slimpar_cache}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
python3 -m slimpar bench gpu --out "$OUT" "$@"
