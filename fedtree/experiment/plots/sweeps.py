"""A sweep's pictures: a line per setting (mean ± std over seeds), and a privacy sweep's
privacy-utility curve."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedtree.experiment.plots import figure
from fedtree.experiment.plots.records import setting_label
from fedtree.experiment.plots.style import legend


def plot_sweep(records: Sequence[Mapping[str, Any]], path: str, *, run: str,
               metric: str = "global/accuracy", title: str | None = None) -> str:
  """A sweep's ``metric`` over rounds: a line per setting (the mean over seeds) and a shaded
  ±std band. ``records`` are every ``metrics.jsonl`` row of the sweep (several per round: one
  per experiment, with ``setting`` and ``seed``; read them all, not :func:`read_metrics`)."""
  plt = figure.pyplot()
  by: dict[str, dict[int, list[float]]] = {}
  for r in records:
    if not (str(r.get("run", "")) == run or str(r.get("run", "")).startswith(run + "#chunk")):
      continue
    if r.get(metric) is None or "setting" not in r:
      continue
    name = setting_label(r["setting"])
    by.setdefault(name, {}).setdefault(int(r["round"]), []).append(float(r[metric]))
  if not by:
    raise ValueError(f"no rows of run {run!r} report {metric!r}")
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for name, pts in by.items():
    x = np.asarray(sorted(pts))
    ys = [np.asarray(pts[i]) for i in x]
    mean = np.asarray([y.mean() for y in ys])
    std = np.asarray([y.std() for y in ys])
    (line,) = ax.plot(x, mean, marker="o", ms=3, label=name)
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
  ax.set_xlabel("round")
  ax.set_ylabel(figure.metric_label(metric))
  ax.grid(alpha=0.3)
  seeds = max(len(v) for pts in by.values() for v in pts.values())
  legend(ax)
  ax.set_title(title or (f"{run}: mean ± std over {seeds} seeds" if seeds > 1 else f"{run}: one seed"))
  return figure.save(fig, path)


def plot_privacy_utility(rows: Sequence[Mapping[str, Any]], path: str, *, run: str,
                         metric: str = "global/accuracy", title: str | None = None) -> str:
  """A privacy sweep's privacy–utility curve: the final ``metric`` (mean ± std over seeds) against
  the ε each setting spent (log scale); settings without privacy (ε infinite, ``z = 0``) are a
  dashed line labelled "no DP". ``rows`` are the sweep's rows (``{name, mean, std}``, their means
  holding ``epsilon`` and ``metric``)."""
  plt = figure.pyplot()
  pts = [(float(r["mean"]["epsilon"]), float(r["mean"][metric]), float(r["std"].get(metric, 0.0)), r["name"])
         for r in rows if "epsilon" in r["mean"] and metric in r["mean"]]
  finite = sorted(p for p in pts if math.isfinite(p[0]) and p[0] > 0)
  if not pts:
    raise ValueError(f"no row of run {run!r} has epsilon and {metric!r}")
  fig, ax = plt.subplots(figsize=(6.0, 3.8))
  if finite:
    x, y, e = (np.asarray([p[i] for p in finite]) for i in range(3))
    ax.errorbar(x, y, yerr=e, marker="o", ms=4, capsize=3, label=run)
    for eps, acc, _, name in finite:
      ax.annotate(name.replace("noise_multiplier", "z"), (eps, acc), fontsize=6,
                  textcoords="offset points", xytext=(3, 3))
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
  for _, acc, _, name in (p for p in pts if not math.isfinite(p[0])):
    ax.axhline(acc, ls="--", color="gray", label=f"no DP ({name})")
  ax.set_xlabel("ε (after the last round)")
  ax.set_ylabel(figure.metric_label(metric.rsplit("/", 1)[-1]))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title(title or f"{run}: privacy–utility (mean ± std over seeds)")
  return figure.save(fig, path)
