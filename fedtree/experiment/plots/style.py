"""The look shared by every picture: a colour per run, line styles and markers per model, and a
legend that stays inside its panel or moves beside the panels."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

LINE_STYLES = ("-", "--", ":", "-.")
"""A line style per model of a run (or per suffix of a family's runs), in order."""
MARKERS = ("o", "s", "^", "D", "v", "x")
"""A marker per model of a run, in order."""


LEGEND_INSIDE = 8
"""Legend entries a panel holds inside; with more, the legend goes outside, right of the panels."""


def run_colors(labels: Iterable[str]) -> dict[str, Any]:
  """A colour per run label, the same in every panel: matplotlib's ``C0``...``C9`` in order for up
  to 10 runs, distinct colours beyond (:func:`palette`)."""
  return palette(labels)


def palette(names: Iterable[str]) -> dict[str, Any]:
  """A colour per name, in order: matplotlib's ``C0``...``C9`` for up to 10 names, ``tab20`` for up
  to 20, evenly spaced along ``turbo`` beyond."""
  names = list(dict.fromkeys(names))
  if len(names) <= 10:
    return {n: f"C{i}" for i, n in enumerate(names)}
  import matplotlib

  cmap = matplotlib.colormaps["tab20" if len(names) <= 20 else "turbo"]
  if len(names) <= 20:
    return {n: cmap(i) for i, n in enumerate(names)}
  return {n: cmap(0.05 + 0.9 * i / (len(names) - 1)) for i, n in enumerate(names)}


def legend(ax, *, title: str | None = None, handles=None, labels=None) -> None:
  """The legend of ``ax`` (or of ``handles``/``labels``): inside the panel up to
  :data:`LEGEND_INSIDE` entries, else outside on the figure's right (in columns of at most 24),
  the figure laid out around it (constrained layout), so that no entry covers a curve or
  leaves the picture."""
  if handles is None:
    handles, labels = ax.get_legend_handles_labels()
  if not handles:
    if title:
      ax.set_title(title, fontsize=8)
    return
  if len(handles) <= LEGEND_INSIDE:
    ax.legend(handles, labels, fontsize=7, title=title, title_fontsize=7)
    return
  fig = ax.figure
  fig.set_layout_engine("constrained")
  fig.legend(handles, labels, loc="outside right upper", fontsize=7, title=title, title_fontsize=7,
             ncols=math.ceil(len(handles) / 24))
  w, h = fig.get_size_inches()
  fig.set_size_inches(w + 1.9 * math.ceil(len(handles) / 24), max(h, 0.16 * min(len(handles), 24) + 1.0))
