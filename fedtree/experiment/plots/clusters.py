"""Clustered runs (paper 004): intra- against inter-cluster accuracy, over rounds and as each
run's final trade-off."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedtree.experiment.plots import figure
from fedtree.experiment.plots.records import curve, models_of, runs


def plot_clusters(records: Sequence[Mapping[str, Any]], path: str, *, title: str | None = None) -> str:
  """Intra- vs inter-cluster accuracy over rounds (paper 004): a panel per run that reports
  them, solid intra, dashed inter, a colour per clustered model."""
  plt = figure.pyplot()
  labels = [r for r in runs(records) if models_of([x for x in records if x["run"] == r],
                                                  "intra_cluster_accuracy")]
  fig, axes = figure.grid(plt, max(1, len(labels)))
  for ax, run in zip(axes, labels, strict=False):
    mine = [r for r in records if str(r["run"]) == run]
    for i, m in enumerate(models_of(mine, "intra_cluster_accuracy")):
      color = f"C{i}"
      for metric, style in (("intra_cluster_accuracy", "-"), ("inter_cluster_accuracy", "--")):
        x, y = curve(mine, run, f"{m}/{metric}")
        ax.plot(x, y, style, color=color, marker="o", ms=3,
                label=f"{m}: {metric.split('_')[0]}")
    ax.set_title(run, fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  figure.share_y(axes)
  fig.suptitle(title or "intra-cluster (solid) vs inter-cluster (dashed) accuracy")
  return figure.save(fig, path)


def plot_cluster_tradeoff(points: Mapping[str, tuple[float, float]], path: str, *,
                          title: str | None = None) -> str:
  """Final intra- against inter-cluster accuracy, a labelled point per run (paper 004's Table 1
  β sweep as a picture). ``points``: ``{label: (intra, inter)}``."""
  plt = figure.pyplot()
  fig, ax = plt.subplots(figsize=(5.2, 4.2))
  for i, (label, (intra, inter)) in enumerate(points.items()):
    ax.scatter([inter], [intra], color=f"C{i % 10}", s=40)
    ax.annotate(label, (inter, intra), textcoords="offset points", xytext=(5, 4 - 11 * (i % 3)),
                fontsize=8)
  ax.set_xlabel("inter-cluster accuracy")
  ax.set_ylabel("intra-cluster accuracy")
  ax.grid(alpha=0.3)
  ax.set_title(title or "intra- vs inter-cluster accuracy")
  return figure.save(fig, path)
