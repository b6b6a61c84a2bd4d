"""The pictures of a report by group or level: grouped bars, and the per-client relative change
of one method against another (paper 000's Fig. 1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedtree.experiment.plots import figure


def plot_relative_change(baseline: Sequence[float], new: Sequence[float], path: str, *,
                         lower_is_better: bool = True, names: tuple[str, str] = ("PerFL", "GroupPerFL"),
                         metric: str = "perplexity", bins: int = 30) -> str:
  """Histogram of the per-client relative change ``(new - baseline) / baseline`` in % (paper
  000's Fig. 1: GroupPerFL vs PerFL perplexity), with the share of clients that improve."""
  plt = figure.pyplot()
  base = np.asarray(baseline, np.float64)
  new = np.asarray(new, np.float64)
  ok = np.isfinite(base) & np.isfinite(new) & (base != 0)
  change = 100.0 * (new[ok] - base[ok]) / np.abs(base[ok])
  better = np.mean(change < 0 if lower_is_better else change > 0) if change.size else float("nan")
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  ax.hist(change, bins=bins, color="C0", alpha=0.8)
  ax.axvline(0.0, color="k", linewidth=1)
  ax.set_xlabel(f"relative change of a client's {metric}, {names[1]} vs {names[0]} (%)")
  ax.set_ylabel("clients")
  ax.set_title(f"{100 * better:.1f} % of {change.size} clients improve with {names[1]}")
  ax.grid(alpha=0.3)
  return figure.save(fig, path)


def plot_group_bars(values: Mapping[str, Sequence[float]], path: str, *,
                    group_names: Sequence[str] | None = None, ylabel: str = "test accuracy",
                    title: str | None = None) -> str:
  """Grouped bars: a bar per label within every group (e.g. accuracy by group per method, or
  accuracy by tree level on clients' and central data). ``values``: ``{label: float[G]}``."""
  plt = figure.pyplot()
  labels = list(values)
  num = max(len(v) for v in values.values())
  names = list(group_names) if group_names is not None else [f"group {g}" for g in range(num)]
  width = 0.8 / max(1, len(labels))
  fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * num + 2), 3.8))
  for i, label in enumerate(labels):
    v = np.asarray(values[label], np.float64)
    ax.bar(np.arange(v.size) + i * width, v, width, label=label)
  ax.set_xticks(np.arange(num) + 0.4 - width / 2, names, fontsize=8)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=7)
  if title:
    ax.set_title(title)
  return figure.save(fig, path)
