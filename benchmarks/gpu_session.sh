#!/bin/bash
# The GPU measurements of benchmarks/README.md ("On a GPU"), as run on a lent H100 through the
# device tool: `bash benchmarks/gpu_session.sh STAGE OUT` from the repository root, with any
# missing wheel in .whl/ (ml_collections there). STAGE: check (environment, GPU tests, the
# chunk / bf16 / conv sweeps that set the GPU defaults) | tables (the README's tables).
set -u
stage=$1; out=$2; res=$out/results; mkdir -p "$res"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
pack() { tar czf "$out/results.tgz" -C "$out" results; }   # after every command: partial runs come back
T="python3 -m benchmarks.throughput --frameworks=fedtree,central,torch --timeout=300 --out-dir=$res"
if [ "$stage" = check ]; then
  nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import jax, jaxlib, flax, optax, torch; print('jax', jax.__version__, jax.devices(),
'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
  timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/test_core_algorithms.py \
    tests/test_precision.py tests/test_tier.py tests/test_tuning.py 2>&1 | tail -15
  $T --workload=a --clients=10000 --variants --chunk-sweep=256,2500,5000,10000 --repeats=3 \
    --fused-rounds=5 --tag=gpu_sweep_a10000
  $T --workload=b --variants --repeats=3 --fused-rounds=10 --tag=gpu_sweep_b
elif [ "$stage" = tables ]; then
  $T --workload=a --clients=1000 --variants --repeats=3 --fused-rounds=20 --tag=gpu_a_1000; pack
  $T --workload=a --clients=10000 --variants --repeats=3 --fused-rounds=5 --tag=gpu_a_10000; pack
  $T --workload=b --variants --repeats=3 --fused-rounds=10 --tag=gpu_b; pack
  $T --workload=c --repeats=3 --fused-rounds=20 --tag=gpu_c; pack
  $T --workload=a --clients=100000 --repeats=3 --fused-rounds=1 --torch-max-clients=10000 \
    --tag=gpu_a_100000; pack
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
pack && rm -rf "$res"
