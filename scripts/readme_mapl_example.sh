#!/usr/bin/env bash
# The README's MAPL example, run as the README writes it; its figures go to
# docs/results/readme_mapl_example/summary.json, from which `slimpar bench readme` writes the README's paragraph.
# Bytes do not depend on machine load. About 5 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=(slimpar train --config configs/llama_small.toml --parallel.mode pipeline --parallel.workers 4
     --pipeline.stages 4 --pipeline.schedule 1f1b --pipeline.microbatches 4
     --pipeline.codec mapl --pipeline.compression 4 --train.steps 100)
run=$(mktemp -d)/run
python3 -m slimpar "${cmd[@]:1}" --out "$run" --log.progress false
python3 - "$run/summary.json" "${cmd[*]}" <<'PY'
import datetime, json, os, sys
s = json.load(open(sys.argv[1]))
keep = ["git_commit", "versions", "machine", "steps", "world_size", "train_loss", "val_loss",
        "boundary_bytes_per_step_fwd", "boundary_bytes_per_step_bwd", "comm_bytes_per_step_none",
        "tied_bytes_per_step_fwd", "tied_bytes_per_step_bwd", "comm_bytes_per_step_fwd", "comm_bytes_per_step_bwd",
        "compression_ratio", "compression_ratio_fwd", "compression_ratio_bwd", "compression_ratio_boundary",
        "compression_ratio_boundary_fwd", "compression_ratio_boundary_bwd", "max_orth_error", "pipeline_rank",
        "boundary_fraction_fwd", "boundary_fraction_bwd", "payload_share_fwd", "payload_share_bwd"]
out = {k: s.get(k) for k in keep}
out["command"] = sys.argv[2]
out["measured"] = (f"{datetime.date.today().isoformat()}, a fresh run folder, on a {os.cpu_count()}-CPU machine "
                   "(bytes do not depend on load)")
os.makedirs("docs/results/readme_mapl_example", exist_ok=True)
json.dump(out, open("docs/results/readme_mapl_example/summary.json", "w"), indent=2)
print("docs/results/readme_mapl_example/summary.json: commit", out["git_commit"][:7], "ratio", out["compression_ratio"])
PY
