"""A picture's figure: matplotlib imported when one is drawn, panels in a grid, a metric's axis
label, and the PNG written (:func:`save`)."""

from __future__ import annotations

import math
import os


def pyplot():
  """matplotlib.pyplot, imported now (the non-interactive ``Agg`` backend when none was chosen)."""
  import matplotlib

  if "matplotlib.pyplot" not in __import__("sys").modules:
    matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def save(fig, path: str) -> str:
  """Writes ``fig`` to ``path`` (PNG, integer ticks where an axis counts rounds) and closes it."""
  from matplotlib.ticker import MaxNLocator

  for ax in fig.axes:
    if ax.get_xlabel() == "round":
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if fig.get_layout_engine() is None:   # a constrained figure (legend outside) lays itself out
    fig.tight_layout()
  fig.savefig(path, dpi=110)
  pyplot().close(fig)
  return path


def grid(plt, n: int, width: float = 4.2, height: float = 3.0, max_cols: int = 3):
  """``(figure, its first n axes)``: ``n`` panels of ``width`` x ``height`` inches, at most ``max_cols``
  a line, the grid's unused cells hidden."""
  cols = min(n, max_cols)
  rows = math.ceil(n / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
  for ax in axes.flat[n:]:
    ax.set_visible(False)
  return fig, list(axes.flat[:n])


def share_y(axes) -> None:
  """One y range for every panel of ``axes``: the union of those that drew a line."""
  lims = [ax.get_ylim() for ax in axes if ax.lines]
  if lims:
    lo, hi = min(a for a, _ in lims), max(b for _, b in lims)
    for ax in axes:
      ax.set_ylim(lo, hi)


def metric_label(metric: str) -> str:
  """The axis label of ``metric`` (``"train_loss"`` -> ``"training loss"``)."""
  return {"accuracy": "test accuracy", "loss": "test loss", "train_loss": "training loss",
          "false_accept_rate": "false-accept rate", "false_reject_rate": "false-reject rate",
          "intra_cluster_accuracy": "intra-cluster accuracy",
          "inter_cluster_accuracy": "inter-cluster accuracy",
          "perplexity": "test perplexity (token level)",
          "sentence_perplexity": "test perplexity (sentence level)"}.get(metric, metric.replace("_", " "))
