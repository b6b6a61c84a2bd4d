"""The benchmark results (``benchmarks/results/*.json``): throughput against the clients per
round, and the scaling sweeps."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedtree.experiment.plots import figure


def plot_throughput(results: Sequence[Mapping[str, Any]], path: str, *, title: str | None = None) -> str:
  """Client updates per second against the number of clients, a line per framework label, a
  panel per benchmark workload (the ``results`` list of ``benchmarks/results/<tag>.json``;
  skipped entries are left out)."""
  plt = figure.pyplot()
  ok = [r for r in results if "skipped" not in r and r.get("client_updates_per_s")]
  workloads = list(dict.fromkeys(r["workload"]["name"] for r in ok))
  fig, axes = figure.grid(plt, max(1, len(workloads)), width=4.6, height=3.6)
  for ax, w in zip(axes, workloads, strict=False):
    mine = [r for r in ok if r["workload"]["name"] == w]
    labels = list(dict.fromkeys(r["label"] for r in mine))
    sizes = sorted({r["workload"]["num_clients"] for r in mine})
    model = mine[0]["workload"]["model"]
    if len(sizes) == 1:  # one size: a bar per framework
      ys = [next(r["client_updates_per_s"] for r in mine if r["label"] == lab) for lab in labels]
      ax.bar(range(len(labels)), ys, color=[f"C{i % 10}" for i in range(len(labels))])
      ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=20)
      ax.set_xlabel(f"{sizes[0]:,} clients per round")
    else:
      for label in labels:
        pts = sorted((r["workload"]["num_clients"], r["client_updates_per_s"]) for r in mine
                     if r["label"] == label)
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, marker="o", label=label)
      ax.set_xscale("log")
      ax.set_yscale("log")
      ax.set_xlabel("clients per round")
      ax.legend(fontsize=7)
    ax.set_ylabel("client updates / s")
    ax.set_title(f"workload {w}: {model}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
  fig.suptitle(title or "throughput (higher is better)")
  return figure.save(fig, path)


def plot_scaling(scaling: Mapping[str, Any], path: str, *, title: str | None = None) -> str:
  """``benchmarks/results/scaling.json``: seconds per round against the cohort size (log-log,
  with the linear reference) and against the tree depth."""
  plt = figure.pyplot()
  fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 3.8))
  cs = sorted(scaling.get("cohort_sweep", []), key=lambda r: r["cohort"])
  if cs:
    k = np.asarray([r["cohort"] for r in cs], np.float64)
    t = np.asarray([r["seconds_per_round"] for r in cs])
    a.loglog(k, t, "o-", label="fedtree")
    a.loglog(k, t[0] * k / k[0], "k:", label="linear in the cohort")
    a.legend(fontsize=8)
  a.set_xlabel("cohort size (clients per round)")
  a.set_ylabel("seconds per round")
  a.set_title(f"population {scaling.get('population', '?'):,}" if isinstance(
    scaling.get("population"), int) else "cohort sweep", fontsize=10)
  a.grid(alpha=0.3, which="both")
  ds = sorted(scaling.get("depth_sweep", []), key=lambda r: r["depth"])
  b.bar([str(r["depth"]) for r in ds], [1e3 * r["seconds_per_round"] for r in ds])
  b.set_xlabel("server levels above the clients")
  b.set_ylabel("ms per round")
  b.set_title("tree depth", fontsize=10)
  b.grid(alpha=0.3, axis="y")
  fig.suptitle(title or "scaling")
  return figure.save(fig, path)


def plot_benchmark_file(json_path: str, path: str) -> str:
  """Draws a ``benchmarks/results/*.json`` file: :func:`plot_scaling` for a scaling sweep,
  :func:`plot_throughput` for a throughput comparison."""
  with open(json_path) as f:
    data = json.load(f)
  if "cohort_sweep" in data or "depth_sweep" in data:
    return plot_scaling(data, path)
  return plot_throughput(data["results"], path, title=os.path.basename(json_path))
