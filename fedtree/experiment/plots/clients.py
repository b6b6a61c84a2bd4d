"""Per-client distributions: a histogram per series on shared axes, or a box per series when
there are many."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedtree.experiment.plots import figure


def plot_client_histograms(values: Mapping[str, Sequence[float]], path: str, *,
                           xlabel: str = "test accuracy of a client", bins: int = 20,
                           title: str | None = None, max_cols: int = 4) -> str:
  """Per-client distributions: a panel per label (a filled histogram with its mean marked), on
  shared bins and axes so the panels compare at a glance (NaN entries, i.e. clients without
  test data, are dropped). ``values``: ``{label: float[C]}``."""
  plt = figure.pyplot()
  arrays = {k: np.asarray(v, np.float64) for k, v in values.items()}
  arrays = {k: v[np.isfinite(v)] for k, v in arrays.items()}
  pooled = np.concatenate([v for v in arrays.values() if v.size] or [np.zeros(1)])
  lo, hi = float(pooled.min()), float(pooled.max())
  edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
  fig, axes = figure.grid(plt, max(1, len(arrays)), width=3.4, height=2.6, max_cols=max_cols)
  top = 0
  for i, (ax, (label, v)) in enumerate(zip(axes, arrays.items(), strict=False)):
    counts, _, _ = ax.hist(v, bins=edges, color=f"C{i % 10}", alpha=0.75)
    top = max(top, float(np.max(counts)) if counts.size else 0)
    if v.size:
      ax.axvline(v.mean(), color="k", linewidth=1.2, linestyle="--")
    ax.set_title(f"{label}\nmean {v.mean():.3f} over {v.size} clients" if v.size else label, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("clients", fontsize=8)
    ax.grid(alpha=0.3)
  for ax in axes:
    ax.set_ylim(0, top * 1.08 + 0.5)
    ax.set_xlim(edges[0], edges[-1])
  fig.suptitle(title or "per-client distribution (dashed: mean)")
  return figure.save(fig, path)


def plot_client_boxes(values: Mapping[str, Sequence[float]], path: str, *,
                      xlabel: str = "test accuracy of a client", title: str | None = None) -> str:
  """Per-client distributions of many runs, a horizontal box per label (median, quartiles, the
  10th-90th percentile whiskers, the mean as a dot), in the order given: what
  :func:`plot_client_histograms` becomes when a panel per label would be too many.
  ``values``: ``{label: float[C]}`` (NaN entries dropped)."""
  plt = figure.pyplot()
  arrays = {k: np.asarray(v, np.float64) for k, v in values.items()}
  arrays = {k: v[np.isfinite(v)] for k, v in arrays.items() if np.isfinite(v).any()}
  labels = list(arrays)[::-1]   # the first label on top
  import matplotlib

  new = tuple(int(p) for p in matplotlib.__version__.split(".")[:2]) >= (3, 10)
  horizontal = {"orientation": "horizontal"} if new else {"vert": False}   # vert: deprecated in 3.11
  fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.2 * len(labels)))
  ax.boxplot([arrays[k] for k in labels], **horizontal, whis=(10, 90), showfliers=False, widths=0.6,
             patch_artist=True, boxprops=dict(facecolor="0.85", edgecolor="0.3"),
             medianprops=dict(color="C0", linewidth=1.5))
  ax.plot([arrays[k].mean() for k in labels], np.arange(1, len(labels) + 1), "k.", ms=4, label="mean")
  ax.set_yticks(np.arange(1, len(labels) + 1), labels, fontsize=7)
  ax.set_xlabel(xlabel)
  ax.grid(alpha=0.3, axis="x")
  ax.legend(fontsize=7, loc="lower left")
  ax.set_title(title or "per-client distribution (box: quartiles; whiskers: 10th-90th percentile)",
               fontsize=10)
  return figure.save(fig, path)
