"""How evenly a model serves its clients: the spread of per-client accuracy over rounds, and the
final per-client histograms with their percentiles, worst-10 % mean and Gini coefficient."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fedtree.experiment.plots import figure
from fedtree.experiment.plots.panels import facets, run_lines
from fedtree.experiment.plots.records import curve, runs
from fedtree.experiment.plots.style import legend, run_colors
from fedtree.experiment.plots.summary import fairness_series


def plot_fairness_over_rounds(records: Sequence[Mapping[str, Any]], path: str, *, model: str = "global",
                              metric: str = "accuracy", skip: Iterable[str] = (),
                              title: str | None = None) -> str:
  """How ``model``'s per-client ``metric`` spreads over rounds, per run (a colour each): the median
  client (solid), the mean of the worst 10 % of clients (dashed) and the 10th–90th percentile
  band, from the rows' ``<model>/<metric>_p10|p50|p90|worst10_mean``.

  Args:
    records: from :func:`read_metrics`.
    path: the PNG to write.
    model: the model whose clients are drawn.
    metric: ``"accuracy"`` (or ``"perplexity"`` for a language model: worst is highest).
    skip: runs to leave out.
    title: the figure title.

  Returns:
    ``path``.
  """
  plt = figure.pyplot()
  skip = set(skip)
  key = f"{model}/{metric}"
  labels = [r for r in runs(records) if r not in skip and curve(records, r, f"{key}_p50")[0].size]
  scale = "log" if metric == "perplexity" else "linear"
  default = f"{model}: {figure.metric_label(metric)} per client (band: 10th–90th percentile)"

  def band(ax, run, color):
    x, _ = curve(records, run, f"{key}_p50")
    _, p10 = curve(records, run, f"{key}_p10")
    _, p90 = curve(records, run, f"{key}_p90")
    if p10.size == x.size and p90.size == x.size:
      ax.fill_between(x, p10, p90, color=color, alpha=0.15, linewidth=0)

  if facets(labels) is not None:   # many runs: the median client above, the worst 10 % below (no
    def median(ax, run, color, style):   # bands: a dozen overlapping ones hide every line)
      x, y = curve(records, run, f"{key}_p50")
      ax.plot(x, y, style, color=color, marker="o" if x.size == 1 else None, ms=3)
      ax.set_yscale(scale)

    def worst(ax, run, color, style):
      x, y = curve(records, run, f"{key}_worst10_mean")
      ax.plot(x, y, style, color=color, marker="o" if x.size == 1 else None, ms=3)
      ax.set_yscale(scale)

    fig = run_lines(plt, labels, [("median client", figure.metric_label(metric), median),
                                  ("worst 10 % of clients", figure.metric_label(metric), worst)],
                    xlabel="round", suptitle=title or f"{model}: {figure.metric_label(metric)} per client")
    return figure.save(fig, path)
  colors = run_colors(labels)
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for run in labels:
    x, p50 = curve(records, run, f"{key}_p50")
    xw, worst10 = curve(records, run, f"{key}_worst10_mean")
    marker = "o" if x.size == 1 else None
    ax.plot(x, p50, color=colors[run], marker=marker, ms=4, label=f"{run}: median client")
    ax.plot(xw, worst10, "--", color=colors[run], marker=marker, ms=4, label=f"{run}: worst 10 %")
    band(ax, run, colors[run])
  ax.set_yscale(scale)
  _finish_curves(ax, "round", metric)
  ax.set_title(title or default, fontsize=10)
  return figure.save(fig, path)


def _finish_curves(ax, xlabel: str, metric: str) -> None:
  """Axis labels, a light grid and, when something was drawn, the runs' legend
  (:func:`~fedtree.experiment.plots.style.legend`)."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(figure.metric_label(metric))
  ax.grid(alpha=0.3)
  legend(ax)


def plot_client_fairness(summary: Mapping[str, Any], path: str, *, bins: int = 20,
                         skip: Iterable[tuple[str, str]] = (), title: str | None = None) -> str:
  """A histogram of the final per-client accuracy (perplexity for a language model) of every
  model of a ``summary.json`` (:func:`fairness_series`), a panel each, marking the 10th, 50th
  and 90th percentiles and the worst-10 % mean, with the Gini coefficient in the panel's title.
  More than 6 models are drawn as one chart instead (:func:`_fairness_chart`: a row per model).

  Raises:
    ValueError: the summary has no model with per-client values and a ``fairness`` entry.
  """
  series = fairness_series(summary, skip=skip, max_series=len(summary) * 64)
  if not series:
    raise ValueError("the summary has no model with a 'fairness' entry and per-client values")
  plt = figure.pyplot()
  if len(series) > 6:
    return _fairness_chart(plt, series, path, title=title)
  fig, axes = figure.grid(plt, len(series), width=4.4, height=3.0)
  for ax, (label, (v, fair)) in zip(axes, series.items(), strict=True):
    v = v[np.isfinite(v)]
    metric = str(fair.get("metric", "accuracy"))
    if v.size:
      lo, hi = float(v.min()), float(v.max())
      ax.hist(v, bins=np.linspace(lo, hi if hi > lo else lo + 1e-6, bins + 1), color="0.7",
              edgecolor="0.35", linewidth=0.6)
    for key, style in (("p10", ":"), ("p50", "-"), ("p90", ":")):
      if fair.get(key) is not None:
        ax.axvline(fair[key], color="C0", linestyle=style, linewidth=1.3, label=f"{key} {fair[key]:.3g}")
    if fair.get("worst10_mean") is not None:
      ax.axvline(fair["worst10_mean"], color="C3", linewidth=1.3,
                 label=f"worst 10% mean {fair['worst10_mean']:.3g}")
    gini = fair.get("gini")
    ax.set_title(f"{label}" + (f"  (Gini {gini:.3f})" if gini is not None else ""), fontsize=9)
    ax.set_xlabel(f"test {metric} of a client")
    ax.set_ylabel("clients")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  if title:
    fig.suptitle(title)
  return figure.save(fig, path)


def _fairness_chart(plt, series: Mapping[str, tuple[np.ndarray, Mapping[str, Any]]], path: str, *,
                    title: str | None = None) -> str:
  """Many models' per-client fairness in one chart, a row each: the 10th–90th percentile range,
  the median and the worst-10 % mean (left), and the Gini coefficient (right)."""
  labels = list(series)[::-1]   # the first on top
  fair = [series[k][1] for k in labels]
  y = np.arange(len(labels))
  metric = str(fair[0].get("metric", "accuracy"))
  fig, (ax, gx) = plt.subplots(1, 2, figsize=(9.0, 1.0 + 0.2 * len(labels)), sharey=True,
                               width_ratios=(3, 1))
  get = lambda key: np.asarray([np.nan if f.get(key) is None else f[key] for f in fair], np.float64)  # noqa: E731
  ax.hlines(y, get("p10"), get("p90"), color="0.6", lw=3, label="10th–90th percentile")
  ax.plot(get("p50"), y, "o", color="C0", ms=4, label="median client")
  ax.plot(get("worst10_mean"), y, "o", color="C3", ms=4, label="worst 10 % (mean)")
  ax.set_yticks(y, labels, fontsize=7)
  ax.set_ylim(-0.7, len(labels) - 0.3)
  ax.set_xlabel(f"test {metric} of a client")
  ax.grid(alpha=0.3, axis="x")
  ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, frameon=False)
  gx.barh(y, get("gini"), color="0.5")
  gx.set_xlabel("Gini coefficient")
  gx.grid(alpha=0.3, axis="x")
  fig.suptitle(title or f"per-client {metric} of every model (final)", fontsize=10)
  return figure.save(fig, path)
