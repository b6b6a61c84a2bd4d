r"""What the baselines and the capabilities cost against FedAvg's round, measured in the same run
(issue 41, item 2).

  python -m benchmarks.baselines --clients=10000 --rounds=5 --repeats=3     # the GPU session's size
  python -m benchmarks.baselines --tiny                                     # a CPU check, ~3 minutes

Workload (a) of :mod:`benchmarks.workloads` (the 60-200-200-10 MLP, 64 examples per client, 4 local
steps of batch 16, every client sampled) with the same model, data, cohort, local steps, learning
rates and chunk (FedAvg's, from the backend's chunk policy) for every row, uniform client weights:

* ``fedavg``: the base of every ratio;
* the optimization baselines that exist on this branch: ``scaffold`` (option II, server step 1),
  ``feddyn`` (α = 0.01) where :mod:`fedtree.algorithms` has it; where issue 36's
  ``benchmarks/methods.py`` is present its ``METHODS`` supply these rows instead (FedNova, Mime and
  MimeLite join), so the two benchmarks build each method the same way;
* ``personal_head``: FedAvg whose last layer (``Dense_2``) stays with each client
  (``personal=personal("Dense_2")``, :mod:`fedtree.core.personal`);
* ``dp``: per-client clipping to norm 1 and central Gaussian noise (z = 1) at the server
  (:func:`benchmarks.privacy.dp_path`);
* ``median``: the coordinate-wise median of the cohort's updates (:func:`fedtree.core.robust.median`;
  the cohort's updates kept as one block);
* ``qsgd8``: 8-bit QSGD on the uplink (:func:`fedtree.core.compression.compressor`).

Every row is built and compiled first (``--rounds`` rounds fused per call,
:func:`fedtree.core.loop.compile_rounds`), then the calls are interleaved (A B C ... A B C ...) for
``--repeats`` turns, each timed by the wall clock and by this process's CPU time; reported per
row: seconds per round (median over the turns), client updates per second, and the ratio of its
round to FedAvg's in the same turn (median and range over the turns), by CPU and by wall time, and
the compile time (the first call) apart. On a GPU the wall ratio is the figure (the CPU time is
the host's dispatch); on a shared CPU the CPU ratio. Writes ``<out-dir>/<tag>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
import optax

from benchmarks import workloads
from benchmarks.jax_runners import build_fedtree, federated_data, jax_model
from benchmarks.privacy import dp_path
from fedtree import algorithms
from fedtree.core import compression, robust
from fedtree.core.local import LocalSchedule
from fedtree.core.loop import compile_rounds
from fedtree.core.personal import personal
from fedtree.core.updates import UpdatePath

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TINY = dict(clients=200, rounds=2, repeats=3)
"""The CPU check's size."""

Builder = Callable[[dict, workloads.Workload], algorithms.FederatedAlgorithm]


def _fedavg(c: dict, w: workloads.Workload, **host) -> algorithms.FederatedAlgorithm:
  return algorithms.fedavg(server_optimizer=optax.sgd(w.server_lr), weighting="uniform", **c, **host)


def _algorithms() -> dict[str, Builder]:
  """The optimization baselines: issue 36's ``benchmarks.methods.METHODS`` where it exists, else the
  ones this branch has."""
  try:
    from benchmarks import methods  # issue 36's benchmark of the same methods, once merged
  except ImportError:
    methods = None
  if methods is not None:
    return dict(methods.METHODS)
  rows: dict[str, Builder] = {"fedavg": _fedavg}
  rows["scaffold"] = lambda c, w: algorithms.scaffold(local_learning_rate=w.lr,
                                                      server_learning_rate=w.server_lr, **c)
  if hasattr(algorithms, "feddyn"):
    rows["feddyn"] = lambda c, w: algorithms.feddyn(alpha=0.01, **c)
  return rows


CAPABILITIES: dict[str, Builder] = {
  "personal_head": lambda c, w: _fedavg(c, w, personal=personal("Dense_2")),
  "dp": lambda c, w: _fedavg(c, w, update_paths=dp_path(1.0, 1.0)),
  "median": lambda c, w: _fedavg(c, w, update_paths=UpdatePath(aggregator=robust.median())),
  "qsgd8": lambda c, w: _fedavg(c, w, update_paths=UpdatePath(
    client=compression.uplink(compression.compressor("qsgd", bits=8)))),
}
"""FedAvg with one capability each: ``name -> builder(common arguments, workload)``."""

EXPECTED = ("feddyn",)
"""Rows the issue asks for that may be missing on a branch (reported as skipped, never an error)."""


def builders() -> dict[str, Builder]:
  """Every row this branch can build, in the order they are reported."""
  return {**_algorithms(), **CAPABILITIES}


def common_arguments(w: workloads.Workload, data, chunk) -> dict:
  return dict(model=jax_model(w), data=data, local_optimizer=optax.sgd(w.lr),
              schedule=LocalSchedule(batch_size=w.batch_size, steps=w.local_steps), cohort_size=w.cohort,
              chunk_size=chunk)


def measure(w: workloads.Workload, names: list[str], *, rounds: int, repeats: int) -> list[dict]:
  """Every row of ``names`` on ``w``, interleaved (module docstring)."""
  table_of = builders()
  data = federated_data(w)
  _, chunk = build_fedtree(w, data)        # FedAvg's chunk for this workload, used by every row
  common = common_arguments(w, data, chunk)
  key = jax.random.key(w.seed)
  steps, states, out = {}, {}, {}
  for name in names:
    alg = table_of[name](common, w)
    steps[name] = compile_rounds(alg, rounds)
    t = time.perf_counter()
    state, m = steps[name](alg.init(key), data, jax.random.fold_in(key, 0))
    jax.block_until_ready((state, m))
    states[name] = state
    out[name] = dict(method=name, compile_s=time.perf_counter() - t, wall=[], cpu=[], chunk_size=chunk,
                     clients_per_round=float(np.mean(np.asarray(m["clients_trained"]))))
    print(f"  {name}: compiled in {out[name]['compile_s']:.1f} s", flush=True)
  for turn in range(repeats):
    for name in names:
      wall, cpu = time.perf_counter(), time.process_time()
      states[name], m = steps[name](states[name], data, jax.random.fold_in(key, turn + 1))
      jax.block_until_ready((states[name], m))
      out[name]["wall"].append((time.perf_counter() - wall) / rounds)
      out[name]["cpu"].append((time.process_time() - cpu) / rounds)
      out[name]["final_loss"] = float(np.asarray(m["train_loss"])[-1])
  base = out["fedavg"]
  rows = []
  for name in names:
    r = out[name]
    for clock in ("cpu", "wall"):
      r[f"{clock}_s_per_round"] = statistics.median(r[clock])
      r[f"client_updates_per_{clock}_s"] = r["clients_per_round"] / r[f"{clock}_s_per_round"]
      paired = [x / b for x, b in zip(r[clock], base[clock], strict=True)]   # the same turn: drift cancels
      r[f"{clock}_vs_fedavg"] = statistics.median(paired)
      r[f"{clock}_vs_fedavg_range"] = (min(paired), max(paired))
    rows.append(r)
  return rows


def _ratio(r: dict, clock: str) -> str:
  lo, hi = r[f"{clock}_vs_fedavg_range"]
  return f"{r[f'{clock}_vs_fedavg']:5.2f}x ({lo:.2f}-{hi:.2f})"


def table(w: workloads.Workload, rows: list[dict], skipped: dict[str, str], device: str) -> str:
  load = os.getloadavg()
  head = (f"{w.label()}, {w.local_steps} local steps, on {device}; load average {load[0]:.1f} on "
          f"{os.cpu_count()} cores\n"
          f"{'row':14s} {'CPU s/round':>12s} {'upd/CPU s':>10s} {'x FedAvg (range)':>19s} "
          f"{'wall s/round':>13s} {'upd/wall s':>11s} {'x FedAvg (range)':>19s} {'compile s':>10s}")
  lines = [head, "-" * len(head.splitlines()[-1])]
  for r in rows:
    lines.append(f"{r['method']:14s} {r['cpu_s_per_round']:12.4f} {r['client_updates_per_cpu_s']:10.0f} "
                 f"{_ratio(r, 'cpu'):>19s} {r['wall_s_per_round']:13.4f} "
                 f"{r['client_updates_per_wall_s']:11.0f} {_ratio(r, 'wall'):>19s} {r['compile_s']:10.1f}")
  for name, why in skipped.items():
    lines.append(f"{name:14s} skipped: {why}")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tiny", action="store_true", help=f"the CPU check: {TINY}")
  p.add_argument("--clients", type=int, default=10_000)
  p.add_argument("--rows", default="all", help="comma-separated rows (default all; fedavg always runs)")
  p.add_argument("--rounds", type=int, default=5, help="rounds fused per timed call")
  p.add_argument("--repeats", type=int, default=3, help="timed calls per row (interleaved turns)")
  p.add_argument("--tag", default="baselines")
  p.add_argument("--out-dir", default=RESULTS)
  a = p.parse_args(argv)
  if a.tiny:
    for k, v in TINY.items():
      if getattr(a, k) == p.get_default(k):
        setattr(a, k, v)
  known = builders()
  names = list(known) if a.rows == "all" else [n.strip() for n in a.rows.split(",") if n.strip()]
  unknown = [n for n in names if n not in known and n not in EXPECTED]
  if unknown:
    raise SystemExit(f"--rows: unknown {unknown}; choose from {sorted(known)}")
  skipped = {n: "not on this branch (fedtree.algorithms has no such method yet)"
             for n in list(EXPECTED) if n not in known and (a.rows == "all" or n in names)}
  names = ["fedavg"] + [n for n in names if n != "fedavg" and n in known]
  w = workloads.mlp(a.clients)
  rows = measure(w, names, rounds=a.rounds, repeats=a.repeats)
  text = table(w, rows, skipped, f"{jax.default_backend()} ({jax.devices()[0].device_kind})")
  print(text)
  os.makedirs(a.out_dir, exist_ok=True)
  with open(os.path.join(a.out_dir, f"{a.tag}.json"), "w") as f:
    json.dump(dict(workload=w.label(), rounds_per_call=a.rounds, repeats=a.repeats,
                   load_average=os.getloadavg(), backend=jax.default_backend(),
                   device=jax.devices()[0].device_kind, table=text, results=rows, skipped=skipped,
                   argv=sys.argv[1:] if argv is None else list(argv)), f, indent=1)
  return rows


if __name__ == "__main__":
  main()
