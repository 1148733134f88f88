#!/usr/bin/env bash
# Hardware counters (Nsight Compute) of one replay window per design: every launch of
# the replay kernels in the window, the sections that say where a kernel's time goes.
# Usage: benchmarks/ncu_window.sh OUTDIR [kind:design ...]
# (default: the three designs of each kind at batch 256, L = 16).
# NCU_METRICS=1: instead of the sections, a short list of metrics per launch (time,
# instructions, DRAM bytes, issue and warp-slot use, launch shape), one profiler pass
# or so per launch, as a raw CSV in base units: enough to follow a window's launches
# position by position.
set -euo pipefail
out=${1:?usage: ncu_window.sh OUTDIR [kind:design ...]}
shift
mkdir -p "$out"
pairs=("$@")
if [ ${#pairs[@]} -eq 0 ]; then
  pairs=(mamba2:replay-fp32 mamba2:split-fp32-fp8 mamba2:split-fp16sr-nvfp4
         gdn:replay-fp32 gdn:split-fp32-fp8 gdn:split-fp16sr-nvfp4)
fi
if [ "${NCU_METRICS:-0}" = 1 ]; then
  what=(--metrics "gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__cycles_active.max,gpc__cycles_elapsed.max,dram__throughput.avg.pct_of_peak_sustained_elapsed"
        --csv --page raw --print-units base)
  tag=metrics
else
  what=(--section SpeedOfLight --section Occupancy --section LaunchStats
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis
        --csv --page details)
  tag=ncu
fi
here=$(cd "$(dirname "$0")" && pwd)
for p in "${pairs[@]}"; do  # compile first, in parallel (the profiler runs are serial)
  python3 "$here/profile_steps.py" --kind "${p%%:*}" --design "${p##*:}" &
done
wait
for p in "${pairs[@]}"; do
  kind=${p%%:*}; design=${p##*:}
  if [ "$kind" = mamba2 ]; then re='regex:^(m2_|mamba2_kernel)'; else re='regex:^_(out|prep|flush)_kernel'; fi
  ncu --profile-from-start off --clock-control none -k "$re" "${what[@]}" \
      python3 "$here/profile_steps.py" --kind "$kind" --design "$design" \
      > "$out/${tag}_${kind}_${design}.csv" 2> "$out/${tag}_${kind}_${design}.err" || echo "ncu failed: $p"
done
