python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1; export PYTHONUNBUFFERED=1; mkdir -p $OUT
nproc; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"
for w in 16 8 12; do
  /usr/bin/time -f "%e s wall" timeout 100 python3 benchmarks/time_first_run.py --model qwen3.5-4b --modes precompile --limit 90 --workers $w --out $OUT/first_q4b_w$w.json 2>&1 | tail -3
done
for w in 16 8; do
  timeout 80 python3 benchmarks/time_first_run.py --model nemotron-3-nano-4b --modes precompile --limit 70 --workers $w --out $OUT/first_nano_w$w.json 2>&1 | tail -2
done
for m in nemotron-3-nano-4b qwen3.5-4b; do
  /usr/bin/time -f "%e s wall" timeout 170 python3 benchmarks/paired_bench.py --model $m --batch 256 --rounds 20 --kernels replay-fp32 split-fp32-fp8 split-fp16sr-nvfp4 --mamba-ssm-path .peer/mamba --out $OUT/paired_b256_$m.json > $OUT/paired_b256_$m.log 2>&1; tail -6 $OUT/paired_b256_$m.log
done
