r"""Per-round cost of the robust aggregators against the mean, at cohorts of 10, 100 and 1,000
updates per parent, in the same run.

  python -m benchmarks.robust [--params=100000] [--parents=4] [--cohorts=10,100,1000]

Every aggregator of :mod:`fedtree.toolbox.robust` runs jitted on one block ``[P, K, D]`` (``P``
parents, ``K`` updates each, ``D`` parameters; random normal updates, every slot valid): the
blockwise weighted mean (what the streamed mean computes), the coordinate median, the trimmed
mean (β = 0.1), multi-Krum (f = K/10) and RFA (8 Weiszfeld steps). Reported: the median wall
time of ``--repeats`` calls after one warm-up (compile excluded), its ratio to the mean's, and
the bytes the cohort blocks take (:func:`fedtree.experiment.memory.block_bytes`, the
pairwise-distance aggregators with their ``K x K`` distances), with the largest cohort per
parent that fits in the device's memory (the host's on CPU) for each. Writes
``benchmarks/results/<tag>.json``.

Measured (``--params=10000 --parents=2 --repeats=3 --tag=robust_cpu``, the shared 2-core CPU of
the development machine under a load average of 15-19, so the sorts' times varied up to 8x
between two runs; no GPU was available for this measurement), ms per call:

  ==========  ========  ===========  ============  ==========  =====
  K           mean      median       trimmed mean  multi-Krum  RFA
  ==========  ========  ===========  ============  ==========  =====
  10          0.18      24 (132x)    7.8 (43x)     0.32 (2x)   1.4 (8x)
  100         0.23      580 (2474x)  3000          10 (43x)    3.4 (14x)
  1000        16        8732 (552x)  7653 (484x)   1415 (90x)  148 (9x)
  ==========  ========  ===========  ============  ==========  =====

The order statistics (median, trimmed mean) are a sort along the cohort axis of every
coordinate, slow on XLA's CPU sort; RFA is a few weighted means. Memory: with 10,000 parameters,
2 parents and 23.5 GiB, the blocks fit up to K = 157,978 per parent for the sort-based ones and
K = 35,059 for multi-Krum (its K x K distances dominate past K of a few thousand).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core import tuning
from fedtree.core.updates import Block
from fedtree.experiment.memory import block_bytes
from fedtree.toolbox import robust

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def aggregators(k: int) -> dict:
  return {
    "mean": robust.mean(),
    "median": robust.median(),
    "trimmed_mean": robust.trimmed_mean(beta=0.1),
    "multi_krum": robust.krum(f=max(k // 10, 0)),
    "rfa": robust.geometric_median(iterations=8),
  }


def time_one(agg, block, repeats: int) -> float:
  fn = jax.jit(lambda b: agg.aggregate(b, {}, None)[:2])
  jax.block_until_ready(fn(block))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(block))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def largest_cohort(param_bytes: int, parents: int, pairwise: bool, limit: int | None) -> int | None:
  """The largest ``K`` whose blocks for ``parents`` parents fit in ``limit`` bytes."""
  if limit is None:
    return None
  lo, hi = 0, 1 << 30
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if block_bytes(param_bytes, parents * mid, mid, pairwise=pairwise) <= limit:
      lo = mid
    else:
      hi = mid - 1
  return lo


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--params", type=int, default=100_000)
  p.add_argument("--parents", type=int, default=4)
  p.add_argument("--cohorts", default="10,100,1000")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--tag", default="robust")
  p.add_argument("--out-dir", default=RESULTS)
  a = p.parse_args(argv)
  cohorts = [int(x) for x in a.cohorts.split(",")]
  limit = tuning.device_memory_bytes()
  if limit is None and jax.default_backend() == "cpu":   # the host's memory
    limit = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  results = []
  for k in cohorts:
    x = jax.random.normal(jax.random.key(k), (a.parents, k, a.params), jnp.float32)
    block = Block({"w": x}, jnp.ones((a.parents, k)), jnp.ones((a.parents, k), bool),
                  jnp.arange(a.parents * k, dtype=jnp.int32).reshape(a.parents, k))
    base = None
    for name, agg in aggregators(k).items():
      pairwise = name == "multi_krum"
      row = {"aggregator": name, "cohort": k, "parents": a.parents, "params": a.params,
             "block_mb": block_bytes(4 * a.params, a.parents * k, k, pairwise=pairwise) / 2**20}
      try:
        row["seconds"] = time_one(agg, block, a.repeats)
      except Exception as e:  # noqa: BLE001  (out of memory: reported, the others still run)
        row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
      if name == "mean":
        base = row.get("seconds")
      if "seconds" in row and base:
        row["x_mean"] = row["seconds"] / base
      row["largest_cohort_that_fits"] = largest_cohort(4 * a.params, a.parents, pairwise, limit)
      results.append(row)
    del x, block
  device = f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}"
  lines = [f"robust aggregators, {a.parents} parents x K updates of {a.params:,} float32 parameters "
           f"({device}; median of {a.repeats})",
           f"{'aggregator':<14}{'K':>6}{'ms':>11}{'x mean':>9}{'blocks MB':>11}{'max K fits':>12}"]
  for r in results:
    ms = f"{1e3 * r['seconds']:.2f}" if "seconds" in r else "skipped"
    ratio = f"{r['x_mean']:.1f}" if "x_mean" in r else "-"
    fits = r["largest_cohort_that_fits"]
    lines.append(f"{r['aggregator']:<14}{r['cohort']:>6}{ms:>11}{ratio:>9}{r['block_mb']:>11.1f}"
                 f"{fits if fits is not None else '-':>12}")
  table = "\n".join(lines)
  print(table)
  os.makedirs(a.out_dir, exist_ok=True)
  with open(os.path.join(a.out_dir, f"{a.tag}.json"), "w") as f:
    json.dump({"device": device, "table": table, "results": results}, f, indent=2)
  return results


if __name__ == "__main__":
  main()
