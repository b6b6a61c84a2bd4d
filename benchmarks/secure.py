"""The cost of secure aggregation: FedAvg's round through SecAgg's modular sum, and through the
distributed discrete Gaussian, against the plain FedAvg round measured in the same run.

  python -m benchmarks.secure                                  # workload (a) at 1,000 clients
  python -m benchmarks.secure --clients=100 --rounds=2 --repeats=1   # quick

Workload (a) of ``benchmarks/workloads.py`` (FedAvg, MLP 60-200-200-10: 54,410 parameters, 64
examples per client, 4 local steps of batch 16, every client sampled), uniform weights. Three
rounds, each ``--rounds`` rounds fused per call (``fedtree.core.loop.compile_rounds``), built and
timed in the same process, the calls alternated (``--repeats`` triples, best of each) so that load
on a shared machine hits all alike:

* ``plain``: FedAvg;
* ``secagg``: every client's update clipped to [-8, 8], encoded on 2^22 levels into a 32-bit field
  (stochastic rounding), summed modulo 2^32 and decoded (Flower's SecAgg+ defaults), dropout
  recovery at the threshold 0.5;
* ``ddg``: the distributed discrete Gaussian at 16 bits (clip 1, z = 1): the rotation of the
  update padded to 65,536, the conditional rounding, each client's discrete Gaussian noise.

The overheads are ``secagg / plain - 1`` and ``ddg / plain - 1``, in wall time and in the
process's CPU time. Prints a table and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from benchmarks import jax_runners, workloads
from benchmarks.privacy import builder
from fedtree.core import loop
from fedtree.core.updates import UpdatePath
from fedtree.toolbox import distributed_dp as ddp
from fedtree.toolbox import secagg


def secure_path(encoding, cohort: int) -> UpdatePath:
  """The clients' secure sum with ``encoding`` (a cohort of ``cohort`` under one server)."""
  up, _ = secagg.exchange_bytes(cohort)
  return UpdatePath(client=secagg.client(encoding, exchange_up=up), aggregator=secagg.secure_sum(encoding),
                    node=secagg.recovery(cohort=np.array([cohort]), threshold=0.5))


PATHS = ("secagg", "ddg")


def paths(num_params: int, cohort: int, names=PATHS) -> dict:
  """``{name: update path}`` of the rounds timed: the plain round (``None``) and ``names``."""
  out: dict = {"plain": None}
  if "secagg" in names:
    out["secagg"] = secure_path(secagg.fixed_point(), cohort)
  if "ddg" in names:
    m = ddp.mechanism("ddg", bits=16, clip=1.0, noise_multiplier=1.0, cohort=cohort, survivors=cohort,
                      dim=secagg._pow2(num_params))
    out["ddg"] = secure_path(secagg.distributed([m]), cohort)
  return out


def _block(x):
  jax.block_until_ready(jax.tree.leaves(x))


def overhead(make, data, named: dict, *, rounds: int, repeats: int) -> dict:
  """Best seconds per round of every named path, calls alternated: wall and process CPU time."""
  runs = {}
  for name, path in named.items():
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
  out = {}
  base = runs["plain"]
  for name, r in runs.items():
    out[name] = {"s_per_round": r["best"] / rounds, "cpu_s_per_round": r["cpu"] / rounds,
                 "compile_s": r["compile_s"] - r["best"], "overhead": r["best"] / base["best"] - 1,
                 "cpu_overhead": r["cpu"] / base["cpu"] - 1}
  return out


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=1000)
  p.add_argument("--rounds", type=int, default=4, help="rounds fused per timed call")
  p.add_argument("--repeats", type=int, default=4, help="timed call triples, best of each")
  p.add_argument("--chunk_size", type=int, default=None, help="clients per chunk (default: 'auto')")
  p.add_argument("--paths", default=",".join(PATHS),
                 help=f"the secure rounds timed beside the plain one: {PATHS}")
  p.add_argument("--out", default="benchmarks/results/secure.json")
  args = p.parse_args(argv)
  names = tuple(n for n in args.paths.split(",") if n)
  if set(names) - set(PATHS):
    raise SystemExit(f"--paths={args.paths!r}; choose from {list(PATHS)}")
  w = workloads.mlp(args.clients)
  data = jax_runners.federated_data(w)
  make, chunk = builder(w, data, args.chunk_size)
  num = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(
    jax.eval_shape(jax_runners.jax_model(w).init, jax.random.key(0))))
  res = overhead(make, data, paths(num, w.cohort_size, names), rounds=args.rounds, repeats=args.repeats)
  out = {"workload": w.label(), "chunk_size": chunk, "backend": jax.default_backend(),
         "load_average": list(os.getloadavg()), "rounds": res}
  print(f"{w.label()}, chunk {chunk}, {jax.default_backend()} (load average {os.getloadavg()[0]:.1f})")
  print(f"{'round':<40}{'s/round':>10}{'CPU s/round':>13}{'compile s':>11}{'overhead':>10}{'CPU':>8}")
  names = {"plain": "FedAvg", "secagg": "SecAgg (32-bit field, 2^22 levels)",
           "ddg": "distributed discrete Gaussian (16 bits)"}
  for name, r in res.items():
    print(f"{names[name]:<40}{r['s_per_round']:>10.4f}{r['cpu_s_per_round']:>13.4f}{r['compile_s']:>11.2f}"
          f"{100 * r['overhead']:>+9.1f}%{100 * r['cpu_overhead']:>+7.1f}%")
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
