"""N experiments (seeds) as one compiled program vs N sequential runs (fedtree.core.sweep).

  python -m benchmarks.sweep --n=1,8,32,128 --rounds=20 --out=benchmarks/results/sweep.json

Workloads: ``quickstart`` (FedAvg of configs/quickstart.py, 48 clients, cohort 16) and ``a``
(FedAvg of the MLP workload (a), ``--clients`` clients, all sampled). For every N:

* ``sequential``: N runs one after another as the runner does them (a freshly built algorithm
  per run, so each compiles), wall time in total, and the same N runs with one compiled
  function reused (``sequential_warm_s``: compile excluded);
* ``sweep``: the N seeds stacked into one program (:func:`fedtree.core.sweep.sweep`
  through :func:`fedtree.core.loop.run`), first call (compile + run) and a second run of the
  same compiled function (``sweep_warm_s``); ``compile_s`` is the difference.

The ratio is ``sequential_s / sweep_s`` (both compile included) and the warm ratio. JSON + PNG.
``--sequential_max=K`` times K of the N sequential runs and scales their total to N (at N = 128
the sequential side alone takes over half an hour on a 2-core CPU); the JSON row says how many
were timed (``sequential_timed``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from fedtree.core import loop
from fedtree.core.sweep import sweep


def _block(state):
  jax.block_until_ready(jax.tree.leaves(state))


def quickstart_problem():
  from configs.quickstart import get_config
  from fedtree.experiment import runner
  from fedtree.experiment.registry import build_algorithm

  c = get_config()
  c.progress = False
  ctx = runner.make_context(c)
  return (lambda: build_algorithm("fedavg", c.runs.fedavg, ctx)), ctx.data


def mlp_problem(clients: int):
  from benchmarks import jax_runners, workloads

  w = workloads.mlp(clients)
  data = jax_runners.federated_data(w)
  return (lambda: jax_runners.build_fedtree(w, data)[0]), data


def measure(make, data, n: int, rounds: int, sequential_max: int | None = None) -> dict:
  """One row of the table. ``sequential_max``: time at most that many of the N sequential
  runs and scale their total by ``N / sequential_max`` (each sequential run builds, compiles
  and trains the same problem, so their times are alike; the row records
  ``sequential_timed`` runs out of N)."""
  timed = n if sequential_max is None else max(1, min(n, int(sequential_max)))
  t = time.perf_counter()
  for seed in range(timed):  # the runner: one build (and compile) per run
    _block(loop.run(make(), data, num_rounds=rounds, key=jax.random.key(seed),
                    cache=loop.CompileCache(), check_finite=False))
  seq = (time.perf_counter() - t) * n / timed
  alg, cache = make(), loop.CompileCache()
  _block(loop.run(alg, data, num_rounds=rounds, key=jax.random.key(0), cache=cache, check_finite=False))
  t = time.perf_counter()
  for seed in range(n):
    _block(loop.run(alg, data, num_rounds=rounds, key=jax.random.key(seed), cache=cache, check_finite=False))
  seq_warm = time.perf_counter() - t

  alg = make()
  build = lambda hp: alg  # noqa: E731  (seeds only)
  cache = loop.CompileCache()
  times = []
  for _ in range(2):  # the second sweep shares the first's compiled round (one builder)
    t = time.perf_counter()
    stacked = sweep(build, {}, list(range(n)), name=f"{alg.name}[sweep]")
    _block(loop.run(stacked, data, num_rounds=rounds, key=jax.random.key(0), cache=cache,
                    check_finite=False))
    times.append(time.perf_counter() - t)
  return {"n": n, "rounds": rounds, "sequential_timed": timed, "sequential_s": seq,
          "sequential_warm_s": seq_warm,
          "sweep_s": times[0], "sweep_warm_s": times[1], "compile_s": times[0] - times[1],
          "ratio": seq / times[0], "warm_ratio": seq_warm / times[1]}


def plot(results: dict, path: str) -> str:
  from fedtree.experiment.plots import pyplot, save

  plt = pyplot()
  fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
  for ax, (name, rows) in zip(axes[0], results.items(), strict=True):
    n = [r["n"] for r in rows]
    for key, label in (("sequential_s", "N sequential runs"), ("sweep_s", "one program (sweep)"),
                       ("sweep_warm_s", "one program, compile excluded")):
      ax.plot(n, [r[key] for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("experiments N")
    ax.set_ylabel("wall time (s)")
    ax.set_title(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  return save(fig, path)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", default="1,8,32,128")
  p.add_argument("--rounds", type=int, default=20)
  p.add_argument("--clients", type=int, default=100, help="clients of workload (a)")
  p.add_argument("--workloads", default="quickstart,a")
  p.add_argument("--out", default="benchmarks/results/sweep.json")
  p.add_argument("--sequential_max", type=int, default=None,
                 help="time at most this many of the N sequential runs (each builds and compiles "
                      "the same problem) and scale their total to N; default: all N")
  args = p.parse_args(argv)
  ns = [int(x) for x in args.n.split(",")]
  results = {}
  for name in args.workloads.split(","):
    make, data = quickstart_problem() if name == "quickstart" else mlp_problem(args.clients)
    results[name] = []
    for n in ns:
      r = measure(make, data, n, args.rounds, args.sequential_max)
      results[name].append(r)
      scaled = f" (scaled from {r['sequential_timed']} runs)" if r["sequential_timed"] < n else ""
      print(f"{name} N={n}: sequential {r['sequential_s']:.2f}s{scaled} "
            f"(warm {r['sequential_warm_s']:.2f}s), "
            f"one program {r['sweep_s']:.2f}s (warm {r['sweep_warm_s']:.2f}s, compile "
            f"{r['compile_s']:.2f}s): {r['ratio']:.1f}x ({r['warm_ratio']:.1f}x warm)", flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  meta = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
          "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(), "args": vars(args)}
  with open(args.out, "w") as f:
    json.dump({"meta": meta, "results": results}, f, indent=2)
  print("wrote", args.out, plot(results, os.path.splitext(args.out)[0] + ".png"))
  return results


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
