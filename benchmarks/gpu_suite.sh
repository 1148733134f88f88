#!/usr/bin/env bash
# Everything that needs an NVIDIA GPU, in one go: the test suite on CUDA, the format,
# engine and backend-agreement benchmarks, and the Mamba-2 and GDN kernel benchmarks.
# Usage: benchmarks/gpu_suite.sh OUTDIR   (logs and JSON land in OUTDIR)
# Peers: fla-core must be importable for the GDN benchmark; pass a state-spaces/mamba
# checkout as MAMBA_SSM_PATH to time its selective_state_update beside ours.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_suite.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null
} > "$out/device.txt" 2>&1
step() { echo "== $1 ($(date +%T))"; }
step "pytest on CUDA"
python -m pytest -q -p no:cacheprovider -n 8 tests 2>&1 | tail -40
step "formats"
python benchmarks/bench_formats.py --device cuda --json "$out/formats.json" 2>&1 | tail -20
step "engine"
python benchmarks/bench_engine.py --device cuda --steps 256 > "$out/engine.json" 2>&1
cat "$out/engine.json" | head -5
step "backends"
python benchmarks/compare_backends.py --out "$out/backends.json" > /dev/null 2>&1 \
  && head -c 1500 "$out/backends.json"
step "mamba2 kernels"
python benchmarks/bench_mamba2.py --out "$out/mamba2.json" ${MAMBA_SSM_PATH:+--mamba-ssm-path "$MAMBA_SSM_PATH"} 2>&1 | tail -60
step "gdn kernels"
python benchmarks/bench_gdn.py --out "$out" --extra-models qwen3.5-4b 2>&1 | tail -40
step "done"
