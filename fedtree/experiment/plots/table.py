"""Every run's final result as a heatmap, the runs laid out as a table by the words of their
labels (:func:`grid_of`: attacks x defences)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fedtree.experiment.plots import figure


def grid_of(labels: Iterable[str], min_fill: float = 0.6) -> tuple[int, list[str], list[str]] | None:
  """Run labels as a table: ``(word, rows, columns)`` where a run's column is its ``word``-th word
  (``_``-separated) and its row the label without it, choosing the word that fills most cells
  (ties: the later word), when that table has at least 2 rows and 2 columns and fills
  ``min_fill`` of its cells; else ``None``.

  Example:
    >>> grid_of(["signflip_mean_30", "signflip_median_30", "none_mean", "none_median"])
    (1, ['signflip_30', 'none'], ['mean', 'median'])
  """
  labels = list(dict.fromkeys(labels))
  words = [label.split("_") for label in labels]
  best = None
  for p in range(max((len(w) for w in words), default=0)):
    if any(len(w) <= p for w in words):
      continue
    cols = list(dict.fromkeys(w[p] for w in words))
    rows = list(dict.fromkeys("_".join(w[:p] + w[p + 1:]) for w in words))
    fill = len(labels) / (len(rows) * len(cols)) if rows and cols else 0.0
    if len(rows) >= 2 and len(cols) >= 2 and fill >= min_fill and (best is None or fill >= best[0]):
      best = (fill, p, rows, cols)
  return None if best is None else (best[1], best[2], best[3])


def plot_final_table(summary: Mapping[str, Any], path: str, *, model: str = "global",
                     metrics: Sequence[str] = ("accuracy", "attack_success_rate"),
                     title: str | None = None) -> str:
  """The final ``metrics`` of every run's ``model`` (``summary.json``) as heatmaps, the runs laid
  out as a table by their labels (:func:`grid_of`: e.g. ``{attack}_{defence}_{percent}`` runs as
  attacks x defences), each cell printed in %; a panel per metric some run reports, with the rows
  that report it.

  Raises:
    ValueError: the labels of the runs reporting ``model`` do not form a table.
  """
  vals = {run: models[model] for run, models in summary.items()
          if isinstance(models, Mapping) and isinstance(models.get(model), Mapping)
          and models[model].get("trained", True) is not False}
  layout = grid_of(vals)
  if layout is None:
    raise ValueError(f"the runs {sorted(vals)} do not form a table")
  word, rows, cols = layout
  place = {run: ("_".join(run.split("_")[:word] + run.split("_")[word + 1:]), run.split("_")[word])
           for run in vals}
  panels = []   # (metric, its rows: those with a run reporting it)
  for metric in metrics:
    have = {place[run][0] for run, s in vals.items() if isinstance(s.get(metric), (int, float))}
    if have:
      panels.append((metric, [r for r in rows if r in have]))
  plt = figure.pyplot()
  fig, axes = plt.subplots(len(panels), 1, squeeze=False, height_ratios=[len(r) for _, r in panels],
                           figsize=(0.8 * len(cols) + 3.2, 0.36 * sum(len(r) for _, r in panels)
                                    + 1.3 * len(panels) + 0.6))
  for ax, (metric, names) in zip(axes[:, 0], panels, strict=True):
    table = np.full((len(names), len(cols)), np.nan)
    for run, s in vals.items():
      v = s.get(metric)
      if isinstance(v, (int, float)) and place[run][0] in names:
        table[names.index(place[run][0]), cols.index(place[run][1])] = 100 * float(v)
    good = metric != "attack_success_rate"   # the colour map's light end is the better value
    image = ax.imshow(table, cmap="viridis" if good else "magma_r", aspect="auto")
    lo, hi = np.nanmin(table), np.nanmax(table)
    for i in range(len(names)):
      for j in range(len(cols)):
        if np.isfinite(table[i, j]):
          light = (table[i, j] - lo) / max(1e-9, hi - lo) > 0.5
          ax.text(j, i, f"{table[i, j]:.1f}", ha="center", va="center", fontsize=7,
                  color="black" if light == good else "white")
    ax.set_xticks(range(len(cols)), cols, fontsize=8, rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_title(f"{model} model: final {figure.metric_label(metric)} (%)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
  fig.suptitle(title or "every run's final result, a cell per run (blank: no such run)", fontsize=10)
  return figure.save(fig, path)
