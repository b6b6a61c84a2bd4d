#!/bin/bash
# The GPU measurements of benchmarks/README.md ("On a GPU"), as run on a lent H100 through the
# device tool: `bash benchmarks/gpu_session.sh STAGE OUT [tiny]` from the repository root.
# STAGE: check (environment, GPU tests, the chunk / bf16 / conv sweeps that set the GPU defaults)
#      | tables (the README's tables)
#      | issue41 (pfl-research beside fedtree in pfl's CIFAR-10 benchmark, the baselines' cost at
#        10,000 clients, a profile of workload (a) at 10,000 clients; ~5.5 min on an H100, at most
#        GPU_SESSION_BUDGET = 420 s, the wheels' install included: every step's timeout is cut to fit;
#        on a lent GPU: device run `bash benchmarks/gpu_session.sh issue41 $OUT`, carry [".whl"],
#        timeout_s 540; it prints and writes $OUT/issue41_summary.md, ratios to baselines measured
#        in the same run)
#      | llm (issue 50: federated LoRA on a TinyLlama-shaped base, 1.1 B parameters in bfloat16 with
#        every layer rematerialized, K = 16 clients of 512-token sequences in one compiled round;
#        transformers + peft's per-client loop on the same checkpoint where this python3 has them,
#        else fedtree alone on the same shape; ~3 min on an H100, at most GPU_SESSION_BUDGET = 420 s;
#        device run `bash benchmarks/gpu_session.sh llm $OUT`, timeout_s 480)
#      | issue56 (issue 56: workload (a) against the central bound and the GPU's peaks, the local step's
#        profile, a streamed population's data stall, the LLM round at TinyLlama's shape; ~6 min on an
#        H100 (estimated, not yet run), at most GPU_SESSION_BUDGET = 450 s; device run `bash
#        benchmarks/gpu_session.sh issue56 $OUT`, carry [".whl"], timeout_s 500; it prints and writes
#        $OUT/issue56_summary.md)
#      | wheels (on the CPU machine, before a device call: fills .whl/ with what the GPU machine
#        lacks, ~1 MB: ml_collections for fedtree; pfl-research 0.6.0 and its pure-Python
#        dependencies for issue41, never torch and no CUDA build; the device call then names
#        carry=[".whl"], since .whl/ is ignored by git; each stage installs from it only what
#        its python3 lacks).
# `tiny` (or GPU_SESSION_TINY=1): the same commands at CPU sizes, to test the stage end to end
# without a GPU: `JAX_PLATFORMS=cpu bash benchmarks/gpu_session.sh issue41 /tmp/out tiny` with a
# python3 on PATH that has torch (the CPU build, benchmarks/README.md's Install); pfl and the rest
# come from .whl/ where that python3 lacks them.
set -u
t0=$SECONDS
stage=$1; out=$2; tiny=${3:-${GPU_SESSION_TINY:-}}; res=$out/results; mkdir -p "$res"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT   # the wheels' install and generated data, never under $out
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
# From .whl/ alone, the wheel that fits this Python of each package this Python lacks (attrs and
# packaging are on the GPU image: a carried older one would shadow them for every package).
need=$(ls .whl/*.whl 2>/dev/null | sed -E 's|.*/||; s|-[0-9].*||' | sort -u \
  | python3 -c "import importlib.util as u, sys; print(*[n for n in sys.stdin.read().split() if not u.find_spec(n)])")
if [ -n "$need" ]; then
  echo "installing from .whl/: $need"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$tmp/site" --find-links .whl $need || exit 1
  export PYTHONPATH=$tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
pack() { tar czf "$out/results.tgz" -C "$out" results; }   # after every command: partial runs come back
smi() { command -v nvidia-smi >/dev/null && nvidia-smi "$@"; }
T="python3 -m benchmarks.throughput --frameworks=fedtree,central,torch --timeout=300 --out-dir=$res"
cap() {   # cap SECONDS [SECONDS KEPT FOR LATER STEPS]: a step's timeout within the stage's $budget
  local c=$1 l=$((budget - (SECONDS - t0) - ${2:-0})); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 5 ] && c=5
  echo "$c"
}
# The LLM round at TinyLlama's shape (1.1 B parameters in bfloat16, every layer rematerialized, K = 16
# clients of 512-token sequences), or its 2-layer toy at CPU sizes.
LLM_FULL="--hidden=2048 --layers=22 --heads=32 --kv_heads=4 --intermediate=5632 --vocab=32000 --seq_len=512
  --clients=16 --batch_size=4 --steps=2 --dtype=bfloat16 --remat --repeats=3 --gemm=8192 --gemm_dtype=bfloat16"
llm_frameworks() { python3 -c "import transformers, peft" 2>/dev/null && echo fedtree,torch || echo fedtree; }
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
  # One budget for the stage (GPU_SESSION_BUDGET seconds, default 420 on a GPU): every step's timeout
  # is its own cap cut to what the budget has left after the caps of the steps still to come, so the
  # stage ends inside the budget whatever hangs. H100 estimate: ~5.5 minutes. Steps:
  #  1. pfl-research 1, 3 and 5 processes (30 s of training each, all stopped at the same iteration)
  #     and fedtree, 5 seeds, on the same data and initial weights: pfl_cifar10 keeps its own --budget;
  #  2. the baselines' cost at 10,000 clients, each as x FedAvg's round in the same turn;
  #  3. the profile of workload (a) at 10,000 clients and its passes over parameter-sized buffers.
  # Results: $out/issue41_summary.md (the three tables and their ratios, printed at the end too),
  # $out/results.tgz (JSONs, logs, the HLO and analysis), $out/issue41_trace.tgz (the profile's trace).
  if [ -n "$tiny" ]; then
    budget=${GPU_SESSION_BUDGET:-1500}; tp=900; tb=300; tc=240
    P="--tiny"; B="--clients=200 --rounds=2 --repeats=3"; C="--tiny"
  else
    budget=${GPU_SESSION_BUDGET:-420}; tp=225; tb=110; tc=60
    P="--procs=1,3,5 --iterations=200 --time-limit=30 --timeout=60"
    B="--clients=10000 --rounds=5 --repeats=3"; C="--clients=10000 --rounds=2 --calls=2"
  fi
  data=$tmp/data   # the generated CIFAR-shaped data (~740 MB at the benchmark's size)
  smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$res/issue41_gpu.log"
  python3 -c "import jax, torch, pfl; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__,
'cuda', torch.cuda.is_available(), 'pfl', pfl.__version__)" 2>&1 | tee "$res/issue41_env.log"
  echo "== 1/3 pfl-research beside fedtree (cap $(cap $tp $((tb + tc))) s)"
  c=$(cap $tp $((tb + tc)))
  timeout $c python3 -m benchmarks.pfl_cifar10 $P --budget=$((c - 5)) --data="$data/pfl" --out-dir="$res" \
    --tag=issue41_pfl_cifar10 2>&1 | tee "$res/issue41_pfl.log"; rm -rf "$data/pfl"; pack
  echo "== 2/3 the baselines' cost against FedAvg (cap $(cap $tb $tc) s)"
  timeout "$(cap $tb $tc)" python3 -m benchmarks.methods $B \
    --methods=fedavg,scaffold,feddyn,personal_head,dp,median,qsgd8 --out-dir="$res" --tag=issue41_baselines \
    2>&1 | tee "$res/issue41_baselines.log"; pack
  # The profile without CUDA command buffers, so the trace names every kernel's HLO instruction.
  echo "== 3/3 the profile of workload (a) (cap $(cap $tc) s)"
  start=$SECONDS
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" timeout "$(cap $tc)" \
    python3 -m benchmarks.param_traffic $C --out-dir="$res" > "$res/issue41_profile.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $((SECONDS - start)) -lt 20 ]; then   # the flag refused: profile as it is
    timeout "$(cap $tc)" python3 -m benchmarks.param_traffic $C --out-dir="$res" > "$res/issue41_profile.log" 2>&1
  fi
  head -12 "$res/issue41_profile.log"
  if [ -d "$res/param_traffic/plugins" ]; then   # the trace apart: a large one cannot sink results.tgz
    tar czf "$out/issue41_trace.tgz" -C "$res/param_traffic" plugins && rm -rf "$res/param_traffic/plugins"
  fi
  echo "== summary ($((SECONDS - t0)) s of the budget of $budget s)"
  python3 -m benchmarks.gpu_report issue41 "$res" --seconds=$((SECONDS - t0)) --budget="$budget" \
    | tee "$out/issue41_summary.md"; pack
elif [ "$stage" = llm ]; then
  # benchmarks/llm.py: tokens/s, peak memory and MFU of one round (results/llm_tinyllama.json and the
  # Markdown table at the end of llm.log). `tiny`: its 2-layer toy (a CPU dry run of the stage).
  fw=$(llm_frameworks)
  if [ -n "$tiny" ]; then
    budget=${GPU_SESSION_BUDGET:-900}; L="--tiny"
  else
    budget=${GPU_SESSION_BUDGET:-420}; L=$LLM_FULL
  fi
  smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$res/llm_gpu.log"
  echo "== llm: frameworks $fw (cap $budget s)"
  timeout "$budget" python3 -m benchmarks.llm $L --frameworks=$fw --out_dir="$res" --tag=llm_tinyllama \
    2>&1 | grep -v "Writing model shards" | tee "$res/llm.log"; pack
elif [ "$stage" = issue56 ]; then
  # Issue 56's measurements and those it asks of the populations and LLM issues, in one budget
  # (GPU_SESSION_BUDGET, default 450 s on a GPU; every step's timeout cut to fit, as issue41's):
  #  1. workload (a) at 10,000 clients, fedtree against the central bound, each as a fraction of the
  #     GPU's peaks (benchmarks.hardware), after the local step's passes were cut (one step count per
  #     chunk: no per-slot select; the update ordered after the backward pass: no copy of a weight);
  #  2. the profile of that round: passes per local step against the memory floor, and how many leaves a
  #     step writes once (its SGD update folded into the gradient's GEMM, item 1: XLA:GPU's to do);
  #  3. a streamed population against the same run resident on the GPU, and the share of the run spent
  #     waiting for data (benchmarks.population --what=fits; a StackOverflow-sized store, 16 GB converted
  #     in over an hour, cannot be written inside a lease, so the stall is measured at this size);
  #  4. the batched-adapter LLM round at TinyLlama's shape against transformers + peft's sequential
  #     loop where this python3 has them (else fedtree alone).
  # Results: $out/issue56_summary.md (each step's lines), $out/results.tgz. H100 estimate: ~6 minutes
  # (not yet run on one).
  if [ -n "$tiny" ]; then
    budget=${GPU_SESSION_BUDGET:-1500}; ta=300; tp=200; ts=400; tl=500
    A="--clients=100 --repeats=2 --fused-rounds=2"; C="--tiny"; S="--tiny --repeats=1"; L="--tiny"
  else
    budget=${GPU_SESSION_BUDGET:-450}; ta=60; tp=45; ts=100; tl=230
    A="--clients=10000 --repeats=3 --fused-rounds=5"; C="--clients=10000 --rounds=2 --calls=2"
    S="--repeats=2"; L=$LLM_FULL
  fi
  smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$res/issue56_gpu.log"
  echo "== 1/4 workload (a): fedtree against the central bound (cap $(cap $ta $((tp + ts + tl))) s)"
  timeout "$(cap $ta $((tp + ts + tl)))" python3 -m benchmarks.throughput --workload=a $A \
    --frameworks=fedtree,central --timeout=$ta --out-dir="$res" --tag=issue56_a 2>&1 | tee "$res/issue56_a.log"
  pack
  echo "== 2/4 the profile of the local step (cap $(cap $tp $((ts + tl))) s)"
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" timeout "$(cap $tp $((ts + tl)))" \
    python3 -m benchmarks.param_traffic $C --out-dir="$res" > "$res/issue56_profile.log" 2>&1
  head -6 "$res/issue56_profile.log"; rm -rf "$res/param_traffic/plugins"; pack
  echo "== 3/4 a streamed population against the same run resident (cap $(cap $ts $tl) s)"
  timeout "$(cap $ts $tl)" python3 -m benchmarks.population --what=fits $S 2>&1 \
    | tee "$res/issue56_population.log"; pack
  echo "== 4/4 the LLM round at TinyLlama's shape (cap $(cap $tl) s)"
  timeout "$(cap $tl)" python3 -m benchmarks.llm $L --frameworks="$(llm_frameworks)" --out_dir="$res" \
    --tag=issue56_llm 2>&1 | grep -v "Writing model shards" | tee "$res/issue56_llm.log"; pack
  {
    echo "# Issue 56 on $(smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "this machine")"
    echo "($((SECONDS - t0)) s of the budget of $budget s; every ratio against a baseline of the same run)"
    for f in a profile population llm; do
      echo; echo "## $f"; echo '```'
      if [ -s "$res/issue56_$f.log" ] && [ $f = profile ]; then head -5 "$res/issue56_$f.log"
      elif [ -s "$res/issue56_$f.log" ]; then grep -v "^ *$" "$res/issue56_$f.log" | tail -14
      else echo "**missing** (issue56_$f.log: the step did not run or was cut)"; fi
      echo '```'
    done
  } | tee "$out/issue56_summary.md"; pack
fi
smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
pack && rm -rf "$res"
