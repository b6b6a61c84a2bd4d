r"""Scaling report: fedtree's time per round against cohort size and against tree depth.

  python -m benchmarks.scaling             # cohorts 10 .. 100,000 of 100,000 clients; depth 1..4
  python -m benchmarks.scaling --quick     # cohorts 10 .. 1,000 of 1,000 clients

Workload (a) (MLP 60-200-200-10, 64 examples per client, batch 16, 4 local steps). The cohort
sweep samples ``K`` of the same population every round (FedAvg, default chunk); the depth
sweep runs HierFAVG over 1,000 clients on trees of depth 1 (flat) to 4 (root -> 10 -> 20 ->
40 leaf parents -> clients), every level aggregating every round (the costliest schedule).
Writes ``benchmarks/results/scaling.json`` and ``scaling.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import time

import jax

from benchmarks import workloads
from benchmarks.jax_runners import build_fedtree, federated_data, time_fused
from benchmarks.throughput import RESULTS, machine
from fedtree.core.loop import compile_rounds


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_round(w, data, *, depth: int = 1, chunk_size="auto") -> dict:
  rounds = max(1, min(10, 2000 // w.cohort_size))
  alg, chunk = build_fedtree(w, data, depth=depth, chunk_size=chunk_size)
  step = compile_rounds(alg, rounds)
  state = alg.init(jax.random.key(0))
  _, first, best, loss = time_fused(step, state, data, jax.random.key(1),
                                    repeats=2 if w.cohort_size <= 10_000 else 1)
  return dict(cohort=w.cohort_size, depth=depth, chunk_size=chunk, seconds_per_round=best / rounds,
              compile_s=first - best, client_updates_per_s=w.cohort_size * rounds / best,
              final_loss=loss, peak_rss_mb_so_far=_rss_mb())


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--population", type=int, default=None)
  p.add_argument("--cohorts", default=None, help="comma-separated cohort sizes")
  p.add_argument("--depths", default="1,2,3,4")
  p.add_argument("--tag", default=None)
  args = p.parse_args(argv)
  pop = args.population or (1000 if args.quick else 100_000)
  cohorts = ([int(c) for c in args.cohorts.split(",")] if args.cohorts else
             [c for c in (10, 100, 1000, 10_000, 100_000) if c <= pop])
  out = dict(machine=machine(), population=pop, cohort_sweep=[], depth_sweep=[])
  base = workloads.mlp(pop)
  data = federated_data(base)
  for k in cohorts:
    w = dataclasses.replace(base, cohort=k)
    r = time_round(w, data)
    out["cohort_sweep"].append(r)
    print(f"cohort {k:>7}: {r['seconds_per_round'] * 1e3:10.1f} ms/round  "
          f"{r['client_updates_per_s']:8.0f} client-updates/s  chunk {r['chunk_size']}", flush=True)
  del data
  tree_clients = 1000
  data = federated_data(workloads.mlp(tree_clients))
  for d in [int(x) for x in args.depths.split(",") if x]:
    r = time_round(workloads.mlp(tree_clients), data, depth=d)
    out["depth_sweep"].append(r)
    print(f"depth {d}: {r['seconds_per_round'] * 1e3:10.1f} ms/round", flush=True)
  tag = args.tag or ("scaling_quick" if args.quick else "scaling")
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, f"{tag}.json"), "w") as f:
    json.dump(out, f, indent=1)
  plot(out, os.path.join(RESULTS, f"{tag}.png"))
  print(f"wrote {os.path.join(RESULTS, tag)}.json/.png")
  return out


def plot(out: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
  cs = out["cohort_sweep"]
  a.loglog([r["cohort"] for r in cs], [r["seconds_per_round"] for r in cs], "o-", label="fedtree")
  if cs:
    k0, t0 = cs[0]["cohort"], cs[0]["seconds_per_round"]
    a.loglog([r["cohort"] for r in cs], [t0 * r["cohort"] / k0 for r in cs], "k:", label="linear")
  a.set_xlabel("cohort size (clients per round)")
  a.set_ylabel("seconds per round")
  a.set_title(f"FedAvg MLP, population {out['population']:,}")
  a.legend()
  ds = out["depth_sweep"]
  b.bar([str(r["depth"]) for r in ds], [r["seconds_per_round"] * 1e3 for r in ds])
  b.set_xlabel("tree depth (server levels above the clients)")
  b.set_ylabel("ms per round")
  b.set_title("HierFAVG, 1,000 clients, all levels aggregate")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  t = time.perf_counter()
  main()
  print(f"({time.perf_counter() - t:.0f}s)")
