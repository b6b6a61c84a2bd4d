"""The cost of differential privacy: DP-FedAvg's round against FedAvg's, and a noise sweep as one
program against sequential runs.

  python -m benchmarks.privacy                          # workload (a) at 1,000 clients
  python -m benchmarks.privacy --clients=100 --rounds=2 --repeats=1 --sweep_rounds=2   # quick

Workload (a) of ``benchmarks/workloads.py`` (FedAvg, MLP 60-200-200-10, 64 examples per client,
4 local steps of batch 16, every client sampled), uniform weights:

* **overhead**: the plain round against the same round with per-client clipping (L2, C = 1) and
  central Gaussian noise at the server (z = 1, std 2 z C on the sum), both ``--rounds`` rounds fused
  per call (``fedtree.core.loop.compile_rounds``), built and timed in the same process, the calls
  alternated (``--repeats`` pairs, best of each) so that load on a shared machine hits both alike;
  the overhead is ``dp / plain - 1`` (target: at most 15 % on CPU), in wall time and in the
  process's CPU time (steadier on a shared machine);
* **sweep**: 8 noise multipliers (0, 0.25, ... 4) as one compiled program (the multiplier a traced
  axis, ``fedtree.core.sweep.sweep``) against 8 runs one after another, each
  built and compiled as the runner does (the multiplier a Python constant); ``--sweep_rounds``
  rounds each, compile included on both sides.

Prints a table and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import optax

from benchmarks import jax_runners, workloads
from fedtree.algorithms import fedavg
from fedtree.core import loop, tuning
from fedtree.core.local import LocalSchedule
from fedtree.core.sweep import sweep as stacked_sweep
from fedtree.core.updates import UpdatePath
from fedtree.toolbox import privacy as dp

NOISE_MULTIPLIERS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)


def builder(w: workloads.Workload, data, chunk_size=None):
  """``make(path) -> FederatedAlgorithm``: FedAvg of ``w`` through the update path ``path``, in
  chunks of ``chunk_size`` clients (default: what ``"auto"`` picks for the model)."""
  model = jax_runners.jax_model(w)
  opt = optax.sgd(w.lr)
  schedule = LocalSchedule(batch_size=w.batch_size, epochs=None, steps=w.local_steps)
  chunk = chunk_size or tuning.chunk_policy(model, opt, w.example_shape, w.batch_size)(
    w.cohort_size, 1, [w.cohort_size])

  def make(path):
    return fedavg(model=model, data=data, local_optimizer=opt, schedule=schedule,
                  server_optimizer=optax.sgd(w.server_lr), cohort_size=w.cohort, chunk_size=chunk,
                  weighting="uniform", update_paths=path)

  return make, chunk


def dp_path(z, c=1.0) -> UpdatePath:
  return UpdatePath(client=dp.clip(c), node=dp.central(z, c))


def _block(x):
  jax.block_until_ready(jax.tree.leaves(x))


def overhead(make, data, *, rounds: int, repeats: int) -> dict:
  """Best seconds per round of the plain and the DP round, calls alternated: wall time, and the
  process's CPU time (every thread's; steadier than wall time on a machine shared with other work)."""
  runs = {}
  for name, path in (("plain", None), ("dp", dp_path(1.0))):
    alg = make(path)
    step = loop.compile_rounds(alg, rounds)
    state = alg.init(jax.random.key(0))
    t = time.perf_counter()
    state, m = step(state, data, jax.random.key(1))
    _block(m)
    runs[name] = dict(step=step, state=state, compile_s=time.perf_counter() - t, best=float("inf"),
                      cpu=float("inf"))
  for _ in range(repeats):
    for r in runs.values():
      t, c = time.perf_counter(), time.process_time()
      r["state"], m = r["step"](r["state"], data, jax.random.key(2))
      _block(m)
      r["best"] = min(r["best"], time.perf_counter() - t)
      r["cpu"] = min(r["cpu"], time.process_time() - c)
  plain, priv = runs["plain"]["best"] / rounds, runs["dp"]["best"] / rounds
  plain_cpu, priv_cpu = runs["plain"]["cpu"] / rounds, runs["dp"]["cpu"] / rounds
  return {"plain_s_per_round": plain, "dp_s_per_round": priv, "overhead": priv / plain - 1,
          "plain_cpu_s_per_round": plain_cpu, "dp_cpu_s_per_round": priv_cpu,
          "cpu_overhead": priv_cpu / plain_cpu - 1,
          "plain_compile_s": runs["plain"]["compile_s"] - runs["plain"]["best"],
          "dp_compile_s": runs["dp"]["compile_s"] - runs["dp"]["best"]}


def noise_sweep(make, data, *, rounds: int, zs=NOISE_MULTIPLIERS) -> dict:
  """Wall seconds (compile included) of ``len(zs)`` sequential runs and of one sweep program."""
  t = time.perf_counter()
  for z in zs:   # the runner: one build and compile per run
    _block(loop.run(make(dp_path(float(z))), data, num_rounds=rounds, key=jax.random.key(0),
                    cache=loop.CompileCache(), check_finite=False))
  sequential = time.perf_counter() - t

  def build(hp):
    return make(dp_path(hp["z"]))

  times = []
  cache = loop.CompileCache()
  for _ in range(2):
    t = time.perf_counter()
    stacked = stacked_sweep(build, {"z": [float(z) for z in zs]}, [0] * len(zs), name="fedavg[sweep]")
    _block(loop.run(stacked, data, num_rounds=rounds, key=jax.random.key(0), cache=cache,
                    check_finite=False))
    times.append(time.perf_counter() - t)
  return {"settings": len(zs), "rounds": rounds, "sequential_s": sequential, "sweep_s": times[0],
          "sweep_warm_s": times[1], "ratio": sequential / times[0]}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=1000)
  p.add_argument("--rounds", type=int, default=4, help="rounds fused per timed call (overhead)")
  p.add_argument("--repeats", type=int, default=4, help="timed call pairs (overhead), best of each")
  p.add_argument("--sweep_rounds", type=int, default=5)
  p.add_argument("--settings", type=int, default=len(NOISE_MULTIPLIERS),
                 help=f"noise multipliers swept: the first N of {NOISE_MULTIPLIERS} (0: no sweep)")
  p.add_argument("--chunk_size", type=int, default=None, help="clients per chunk (default: 'auto')")
  p.add_argument("--out", default="benchmarks/results/privacy.json")
  args = p.parse_args(argv)
  w = workloads.mlp(args.clients)
  data = jax_runners.federated_data(w)
  make, chunk = builder(w, data, args.chunk_size)
  over = overhead(make, data, rounds=args.rounds, repeats=args.repeats)
  sw = None   # --settings=0: the overhead only
  if args.settings:
    sw = noise_sweep(make, data, rounds=args.sweep_rounds, zs=NOISE_MULTIPLIERS[:args.settings])
  out = {"workload": w.label(), "chunk_size": chunk, "backend": jax.default_backend(),
         "load_average": list(os.getloadavg()), "overhead": over, "sweep": sw}
  print(f"{w.label()}, chunk {chunk}, {jax.default_backend()} (load average {os.getloadavg()[0]:.1f})")
  print(f"{'round':<32}{'s/round':>10}{'CPU s/round':>13}{'compile s':>11}")
  print(f"{'FedAvg':<32}{over['plain_s_per_round']:>10.4f}{over['plain_cpu_s_per_round']:>13.4f}"
        f"{over['plain_compile_s']:>11.2f}")
  name = "DP-FedAvg (clip + central noise)"
  print(f"{name:<32}{over['dp_s_per_round']:>10.4f}{over['dp_cpu_s_per_round']:>13.4f}{over['dp_compile_s']:>11.2f}")
  print(f"overhead of DP: {100 * over['overhead']:+.1f} % wall, {100 * over['cpu_overhead']:+.1f} % CPU time "
        f"(target <= 15 % on CPU)")
  if sw is not None:
    print(f"{sw['settings']} noise multipliers x {sw['rounds']} rounds: sequential runs "
          f"{sw['sequential_s']:.2f} s, one sweep program {sw['sweep_s']:.2f} s "
          f"(warm {sw['sweep_warm_s']:.2f} s): {sw['ratio']:.2f}x")
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
