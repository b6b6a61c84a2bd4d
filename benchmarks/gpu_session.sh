#!/bin/bash
# The GPU measurements of benchmarks/README.md ("On a GPU"), as run on a lent H100 through the
# device tool: `bash benchmarks/gpu_session.sh STAGE OUT [tiny]` from the repository root.
# STAGE: check (environment, GPU tests, the chunk / bf16 / conv sweeps that set the GPU defaults)
#      | tables (the README's tables)
#      | issue41 (pfl-research beside fedtree in pfl's CIFAR-10 benchmark, the baselines' cost at
#        10,000 clients, a profile of workload (a) at 10,000 clients; ~5 min on an H100, at most
#        7.5 min by the timeouts below)
#      | wheels (on the CPU machine, before a device call: fills .whl/ with what the GPU machine
#        lacks, ~1 MB: ml_collections for fedtree; pfl-research 0.6.0 and its pure-Python
#        dependencies for issue41, never torch and no CUDA build; the device call then names
#        carry=[".whl"], since .whl/ is ignored by git).
# `tiny` (or GPU_SESSION_TINY=1): the same commands at CPU sizes, to test the stage end to end
# without a GPU: `JAX_PLATFORMS=cpu bash benchmarks/gpu_session.sh issue41 /tmp/out tiny` with a
# python3 that has torch (the CPU wheel) on PATH.
set -u
stage=$1; out=$2; tiny=${3:-${GPU_SESSION_TINY:-}}; res=$out/results; mkdir -p "$res"
if [ "$stage" = wheels ]; then   # needs a package registry: run it here, not on the GPU machine
  mkdir -p .whl
  python3 -m pip download -q --no-deps -d .whl ml-collections==1.1.0 pfl==0.6.0 prv-accountant==0.2.0 \
    dp-accounting==0.5.0 attrs==23.2.0 packaging==25.0 dill==0.4.1 || exit 1
  for v in 3.11 3.12; do   # multiprocess's wheels are per Python (the H100 machine had 3.12)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version $v -d .whl \
      multiprocess==0.70.19 || exit 1
  done
  ls -l .whl; exit 0
fi
if ls .whl/*.whl >/dev/null 2>&1; then   # each package's wheel that fits this Python, from .whl/ alone
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site --find-links .whl \
    $(ls .whl/*.whl | sed -E 's|.*/||; s|-[0-9].*||' | sort -u) || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
pack() { tar czf "$out/results.tgz" -C "$out" results; }   # after every command: partial runs come back
smi() { command -v nvidia-smi >/dev/null && nvidia-smi "$@"; }
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
elif [ "$stage" = issue41 ]; then
  # Budget (H100, estimated; each step's timeout is its ceiling): pfl-research 1, 3 and 5 processes
  # (each stops at 40 s of training, so at most ~65 s with its start) and fedtree with 5 seeds,
  # 270 s; the baselines, 100 s; the profile, 60 s (+ a retry only if XLA refused its flag at once).
  if [ -n "$tiny" ]; then
    P="--tiny"; B="--clients=200 --rounds=2 --repeats=3"; C="--tiny"; tp=900; tb=900; tc=600
  else
    P="--procs=1,3,5 --iterations=200 --time-limit=40 --timeout=65"
    B="--clients=10000 --rounds=5 --repeats=3"; C="--clients=10000 --rounds=2 --calls=2"
    tp=270; tb=100; tc=60
  fi
  smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import jax, torch, pfl; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__,
'cuda', torch.cuda.is_available(), 'pfl', pfl.__version__)" 2>&1 | tee "$res/issue41_env.log"
  timeout $tp python3 -m benchmarks.pfl_cifar10 $P --out-dir=$res --tag=issue41_pfl_cifar10 \
    2>&1 | grep -v "^data written" | tee "$res/issue41_pfl.log"; rm -rf "$res/issue41_pfl_cifar10_data"; pack
  timeout $tb python3 -m benchmarks.methods $B \
    --methods=fedavg,scaffold,feddyn,personal_head,dp,median,qsgd8 --out-dir=$res --tag=issue41_baselines \
    2>&1 | tee "$res/issue41_baselines.log"; pack
  # The profile without CUDA command buffers, so the trace names every kernel's HLO instruction.
  start=$SECONDS
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" timeout $tc python3 -m benchmarks.param_traffic \
    $C --out-dir=$res > "$res/issue41_profile.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $((SECONDS - start)) -lt 20 ]; then   # the flag refused: profile as it is
    timeout $tc python3 -m benchmarks.param_traffic $C --out-dir=$res > "$res/issue41_profile.log" 2>&1
  fi
  head -40 "$res/issue41_profile.log"; pack
fi
smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
pack && rm -rf "$res"
