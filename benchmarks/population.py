r"""Populations that do not fit (issue 49): a run over a store on disk against the same run resident.

  python -m benchmarks.population --what=fits        # streamed vs resident where it fits: ratio, same model
  python -m benchmarks.population --what=million     # 10^6 small clients vs 10^4: seconds per round, peak RSS
  python -m benchmarks.population --what=paged       # SCAFFOLD at 10^5 clients, c_i paged; SIGKILL and resume
  python -m benchmarks.population --what=stackoverflow --store=/tmp/so_full/store   # AFO's LSTM, full scale

Every measurement runs in a subprocess of its own (its peak RSS is its own, ``ru_maxrss``) and prints
one JSON line; the ratios are to the baseline measured in the same invocation. ``--tiny`` shrinks every
size (a check that the script runs: ``tests/test_benchmarks.py``). Results: ``benchmarks/README.md``
("Populations that do not fit") and ``docs/scaling.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _peak_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _population(num_clients: int, *, lo: int, hi: int, dim: int, classes: int, seed: int):
  """A synthetic population of ``num_clients`` clients with ``lo..hi`` examples each (Synthetic(α, β)-like:
  a linear model per client), as padded host arrays."""
  from fedtree.core.data import FederatedData

  rng = np.random.default_rng(seed)
  n = rng.integers(lo, hi + 1, num_clients).astype(np.int32)
  w = rng.normal(size=(dim, classes)).astype(np.float32)
  x = rng.normal(size=(num_clients, hi, dim)).astype(np.float32)
  shift = rng.normal(scale=0.5, size=(num_clients, 1, dim)).astype(np.float32)
  x += shift
  y = np.argmax(x @ w, axis=-1).astype(np.int32)
  mask = np.arange(hi)[None, :] < n[:, None]
  x *= mask[..., None]
  y *= mask
  nt = np.minimum(n, 2).astype(np.int32)
  return FederatedData(
    x_train=x,
    y_train=y,
    n_train=n,
    x_test=x[:, :2].copy(),
    y_test=y[:, :2].copy(),
    n_test=nt,
    num_classes=classes,
  )


def _algorithm(name: str, data, model, cohort: int, steps: int):
  import optax

  from fedtree import algorithms as A
  from fedtree.core.local import LocalSchedule

  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(0.05),
    cohort_size=cohort,
    schedule=LocalSchedule(batch_size=4, steps=steps),
  )
  if name == "scaffold":
    return A.scaffold(local_learning_rate=0.05, **common)
  return A.fedavg(**common)


def _timed_rounds(run_fn, rounds: int, warm: int) -> tuple[float, object]:
  """Seconds per round of ``run_fn(num_rounds, on_call) -> state`` over its last ``rounds`` rounds, timed
  between the hook calls ``on_call(state, round)`` after round ``warm`` (compilation, the first read)
  and after the last round: the rounds' steady cost, not a run's one-time setup."""
  marks = {}

  def on_call(state, r):
    marks[int(r)] = time.perf_counter()

  state = run_fn(warm + rounds, on_call)
  return (marks[warm + rounds] - marks[warm]) / rounds, state


def measure(
  mode: str,
  num_clients: int,
  rounds: int,
  cohort: int,
  store_dir: str,
  algorithm: str,
  hidden: int,
  steps: int,
  per_call: int,
) -> dict:
  """One run (``mode``: ``resident`` or ``streamed``) in this process: seconds per round and peak RSS."""
  import jax

  from fedtree.core import loop
  from fedtree.core.data import as_device
  from fedtree.models import build_model
  from fedtree.population import PagedState, open_store, write_federated_data
  from fedtree.population.stream import paged_init, run, skeleton

  path = os.path.join(store_dir, f"store_{num_clients}")
  if not os.path.isdir(path):
    data = _population(num_clients, lo=2, hi=8, dim=16, classes=4, seed=0)
    t0 = time.perf_counter()
    write_federated_data(path, data, source={"name": f"bench_{num_clients}"})
    convert_s = time.perf_counter() - t0
    del data
  else:
    convert_s = None
  store = open_store(path)
  model = build_model("mlp", example_shape=(16,), num_classes=4, hidden=(hidden,))
  key = jax.random.key(0)
  stats = None
  if mode == "resident":
    data = as_device(store.to_federated_data())
    alg = _algorithm(algorithm, data, model, cohort, steps)

    def go(n, on_call):
      return loop.run(alg, data, num_rounds=n, key=key, rounds_per_call=per_call, on_call=on_call)
  else:
    skel = skeleton(store)
    alg = _algorithm(algorithm, skel, model, cohort, steps)
    others, rows_of = paged_init(alg, loop.init_key(key), skel.num_clients)
    paged = PagedState(
      rows_of, skel.num_clients, directory=os.path.join(store_dir, f"paged_{mode}_{num_clients}")
    )

    def go(n, on_call):
      nonlocal stats
      state, stats = run(
        alg,
        skel,
        store,
        num_rounds=n,
        key=key,
        paged=paged,
        others=others,
        rounds_per_call=per_call,
        depth=2,
        on_call=on_call,
      )
      return state

  per_round, state = _timed_rounds(go, rounds, warm=per_call)
  leaves = [np.asarray(a) for a in jax.tree.leaves(alg.models(state)["global"].params)]
  return dict(
    mode=mode,
    clients=num_clients,
    seconds_per_round=per_round,
    peak_rss_mib=_peak_mib(),
    convert_s=convert_s,
    model_sum=float(sum(float(np.sum(a, dtype=np.float64)) for a in leaves)),
    model_sha=hashlib.sha256(b"".join(a.tobytes() for a in leaves)).hexdigest()[:16],
    stall_fraction=None if stats is None else stats.stall_fraction,
  )


def _child(args: list[str]) -> dict:
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = subprocess.run(
    [sys.executable, "-m", "benchmarks.population", "--child", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
  )
  if out.returncode != 0:
    raise RuntimeError(out.stderr[-3000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def fits(a) -> dict:
  c = 2_000 if not a.tiny else 200
  common = [
    "--clients",
    str(c),
    "--rounds",
    str(a.rounds),
    "--cohort",
    str(a.cohort),
    "--store-dir",
    a.store_dir,
    "--per-call",
    str(a.per_call),
    "--hidden",
    str(a.hidden),
    "--steps",
    str(a.steps),
  ]
  runs = _interleaved({m: ["--mode", m, *common] for m in ("resident", "streamed")}, a.repeats)
  res, st = _median(runs["resident"]), _median(runs["streamed"])
  return dict(
    what="fits",
    resident=res,
    streamed=st,
    repeats=a.repeats,
    throughput_ratio=res["seconds_per_round"] / st["seconds_per_round"],
    same_model=all(r["model_sha"] == res["model_sha"] for r in runs["resident"] + runs["streamed"]),
    all_seconds={m: [r["seconds_per_round"] for r in rs] for m, rs in runs.items()},
  )


def _interleaved(children: dict[str, list[str]], repeats: int) -> dict[str, list[dict]]:
  """Every child ``repeats`` times, one of each in turn (the machine's noise hits them alike)."""
  runs: dict[str, list[dict]] = {name: [] for name in children}
  for _ in range(repeats):
    for name, args in children.items():
      runs[name].append(_child(args))
  return runs


def _median(runs: list[dict]) -> dict:
  return sorted(runs, key=lambda r: r["seconds_per_round"])[len(runs) // 2]


def million(a) -> dict:
  big, small = (1_000_000, 10_000) if not a.tiny else (20_000, 2_000)
  common = [
    "--rounds",
    str(a.rounds),
    "--cohort",
    str(a.cohort),
    "--store-dir",
    a.store_dir,
    "--per-call",
    str(a.per_call),
    "--mode",
    "streamed",
  ]
  runs = _interleaved({str(n): ["--clients", str(n), *common] for n in (small, big)}, a.repeats)
  s, b = _median(runs[str(small)]), _median(runs[str(big)])
  return dict(what="million", small=s, big=b, repeats=a.repeats,
              seconds_ratio=b["seconds_per_round"] / s["seconds_per_round"],
              all_seconds={n: [r["seconds_per_round"] for r in rs] for n, rs in runs.items()})


def paged(a) -> dict:
  """SCAFFOLD at 10^5 clients with a model whose c_i together exceed the memory limit: paged on disk; a
  run killed (SIGKILL) after its first checkpoint and resumed ends bitwise where a straight run ends."""
  c = 100_000 if not a.tiny else 2_000
  hidden = 512 if not a.tiny else 16
  args = [
    "--clients",
    str(c),
    "--rounds",
    str(a.rounds),
    "--cohort",
    str(a.cohort),
    "--store-dir",
    a.store_dir,
    "--algorithm",
    "scaffold",
    "--hidden",
    str(hidden),
    "--per-call",
    "1",
    "--mode",
    "streamed",
  ]
  straight = _child(args)
  model_bytes = (16 * hidden + hidden + hidden * 4 + 4) * 4
  return dict(
    what="paged",
    run=straight,
    c_i_bytes_total=model_bytes * c,
    note="the resume after a SIGKILL is tests/test_population_paged.py's and test_population_run.py's",
  )


def _args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--what", choices=("fits", "million", "paged", "stackoverflow"), default="fits")
  p.add_argument("--tiny", action="store_true")
  p.add_argument("--repeats", type=int, default=5, help="fits, million: runs of each (the median)")
  p.add_argument("--rounds", type=int, default=200, help="rounds timed after the first call (compilation)")
  p.add_argument("--cohort", type=int, default=100)
  p.add_argument("--per-call", type=int, default=5)
  p.add_argument("--store-dir", default=None)
  p.add_argument("--child", action="store_true")
  p.add_argument("--mode", default="streamed")
  p.add_argument("--clients", type=int, default=1000)
  p.add_argument("--algorithm", default="fedavg")
  p.add_argument("--hidden", type=int, default=32)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--store", default=None)
  a = p.parse_args(argv)
  a.store_dir = a.store_dir or tempfile.mkdtemp(prefix="fedtree_population_")
  return a


def main(argv=None) -> None:
  a = _args(argv)
  if a.child:
    print(
      json.dumps(
        measure(
          a.mode, a.clients, a.rounds, a.cohort, a.store_dir, a.algorithm, a.hidden, a.steps, a.per_call
        )
      )
    )
    return
  if a.what == "stackoverflow":
    print(json.dumps(stackoverflow(a)))
    return
  print(json.dumps({"fits": fits, "million": million, "paged": paged}[a.what](a)))


def stackoverflow(a) -> dict:
  """AFO's StackOverflow FedAvg, cohort 50, over the converted store under a 6 GB limit: seconds per round,
  the share of time waiting for data and the peak RSS (``python -m fedtree.main`` in a subprocess)."""
  if not a.store:
    raise SystemExit(
      "--what=stackoverflow needs --store=DIR (python -m fedtree.convert "
      "--config=configs/benchmarks/afo_stackoverflow.py --out=DIR)"
    )
  work = tempfile.mkdtemp(prefix="fedtree_so_")
  cmd = [
    sys.executable,
    "-m",
    "fedtree.main",
    "--config=configs/benchmarks/afo_stackoverflow.py:store",
    f"--workdir={work}",
    f"--config.data.path={a.store}",
    f"--config.rounds={a.rounds}",
    "--config.only=fedavg",
    "--config.memory_limit_bytes=6000000000",
    "--config.progress=False",
    f"--config.rounds_per_call={a.per_call}",
    f"--config.eval_every={a.rounds}",
    "--config.checkpoint_every=0",
    "--config.population.eval_clients=100",
  ]
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  peak = 0.0
  while proc.poll() is None:
    try:
      with open(f"/proc/{proc.pid}/status") as f:
        for line in f:
          if line.startswith("VmHWM"):
            peak = max(peak, float(line.split()[1]) / 1024.0)
    except OSError:
      pass
    time.sleep(0.5)
  lines = proc.stdout.read().splitlines() if proc.stdout else []
  return dict(
    what="stackoverflow",
    wall_s=time.perf_counter() - t0,
    peak_rss_mib=peak,
    returncode=proc.returncode,
    lines=[ln for ln in lines if "calls; waited" in ln or "population:" in ln or "memory estimate" in ln],
  )


if __name__ == "__main__":
  main()
