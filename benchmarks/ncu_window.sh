#!/usr/bin/env bash
# Hardware counters (Nsight Compute) of one replay window per design: every launch of
# the replay kernels in the window, the sections that say where a kernel's time goes.
# Usage: benchmarks/ncu_window.sh OUTDIR [kind:design ...]
# (default: the three designs of each kind at batch 256, L = 16).
set -euo pipefail
out=${1:?usage: ncu_window.sh OUTDIR [kind:design ...]}
shift
mkdir -p "$out"
pairs=("$@")
if [ ${#pairs[@]} -eq 0 ]; then
  pairs=(mamba2:replay-fp32 mamba2:split-fp32-fp8 mamba2:split-fp16sr-nvfp4
         gdn:replay-fp32 gdn:split-fp32-fp8 gdn:split-fp16sr-nvfp4)
fi
here=$(cd "$(dirname "$0")" && pwd)
for p in "${pairs[@]}"; do  # compile first, in parallel (the profiler runs are serial)
  python3 "$here/profile_steps.py" --kind "${p%%:*}" --design "${p##*:}" &
done
wait
for p in "${pairs[@]}"; do
  kind=${p%%:*}; design=${p##*:}
  if [ "$kind" = mamba2 ]; then re='regex:^(m2_|mamba2_kernel)'; else re='regex:^_(out|prep|flush)_kernel'; fi
  ncu --profile-from-start off --clock-control none -k "$re" \
      --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --csv --page details \
      python3 "$here/profile_steps.py" --kind "$kind" --design "$design" \
      > "$out/ncu_${kind}_${design}.csv" 2> "$out/ncu_${kind}_${design}.err" || echo "ncu failed: $p"
done
