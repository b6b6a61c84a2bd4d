"""Many runs in one picture: a panel per family of runs (:func:`facets`), a colour and a line
style per run the same in every panel, and one legend beside them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from fedtree.experiment.plots.style import LINE_STYLES, legend, palette, run_colors

FACET_ABOVE = 12
"""More runs than this in one picture are drawn a panel per family of runs (:func:`facets`)."""


def facets(labels: Iterable[str], above: int = FACET_ABOVE) -> dict[str, list[str]] | None:
  """Panels for many runs: ``{first word: its runs}``, the words of a label separated by ``_``
  (``signflip_median_30`` is in panel ``signflip``), when there are more than ``above`` runs and
  that gives 2 to 12 panels, one of them with several runs; else ``None`` (one panel).

  Example:
    >>> facets([f"{a}_{d}" for a in ("none", "signflip") for d in ("mean", "median")], above=3)
    {'none': ['none_mean', 'none_median'], 'signflip': ['signflip_mean', 'signflip_median']}
  """
  labels = list(dict.fromkeys(labels))
  if len(labels) <= above:
    return None
  groups: dict[str, list[str]] = {}
  for label in labels:
    groups.setdefault(label.split("_", 1)[0], []).append(label)
  if not 2 <= len(groups) <= 12 or max(len(g) for g in groups.values()) < 2:
    return None
  return groups


def _words(label: str, panel: str | None) -> tuple[str, str]:
  """``(colour key, style key)`` of a run within its panel: the word after the panel's, and the
  rest (``signflip_median_30`` in panel ``signflip`` -> ``("median", "30")``; without panels the
  whole label and ``""``)."""
  if panel is None or not label.startswith(panel + "_"):
    return label, ""
  first, _, rest = label[len(panel) + 1:].partition("_")
  return first, rest


def facet_figure(plt, panels: Mapping[str, list[str]], rows: Sequence[tuple[str, str, Callable]], *,
                 suptitle: str, xlabel: str = "round"):
  """A grid of panels: a column per family of runs (``panels``, :func:`facets`) and a row per entry
  of ``rows`` (``(row title, y label, draw(ax, run, colour, line style))``; with more than 6
  families, the first row only, wrapped 4 panels a line). A run's colour is its second word and
  its line style the rest (``signflip_median_30``: median, 30), the same in every panel, explained
  by one legend outside. Returns the figure."""
  from matplotlib.lines import Line2D

  keys = {run: _words(run, panel) for panel, members in panels.items() for run in members}
  colors = palette(k for k, _ in keys.values())
  style_keys = list(dict.fromkeys(st for _, st in keys.values()))
  styles = {st: LINE_STYLES[i % len(LINE_STYLES)] for i, st in enumerate(style_keys)}
  n = len(panels)
  if n > 6:
    rows = rows[:1]
  cols = n if len(rows) > 1 else min(n, 4)
  lines = len(rows) if len(rows) > 1 else math.ceil(n / cols)
  fig, axes = plt.subplots(lines, cols, figsize=(3.3 * cols, 2.7 * lines), squeeze=False, sharex=True,
                           sharey="row")
  for ax in axes.flat:
    ax.set_visible(False)
  for i, (panel, members) in enumerate(panels.items()):
    for r, (row_title, ylabel, draw) in enumerate(rows):
      ax = axes[r, i] if len(rows) > 1 else axes.flat[i]
      ax.set_visible(True)
      for run in members:
        color_key, style_key = keys[run]
        draw(ax, run, colors[color_key], styles[style_key])
      ax.set_title(f"{panel}: {row_title}" if row_title else panel, fontsize=9)
      ax.set_xlabel(xlabel, fontsize=8)
      ax.set_ylabel(ylabel, fontsize=8)
      ax.tick_params(labelsize=7, labelbottom=True, labelleft=True)
      ax.grid(alpha=0.3)
  handles = [Line2D([], [], color=c, lw=2) for c in colors.values()]
  labels = [f"…_{k}…" if len(style_keys) > 1 else k for k in colors]
  if len(style_keys) > 1:
    handles += [Line2D([], [], color="0.3", ls=styles[st]) for st in style_keys]
    labels += [f"…_{st}" if st else "(no suffix)" for st in style_keys]
  fig.set_layout_engine("constrained")
  fig.legend(handles, labels, loc="outside right upper", fontsize=7, ncols=math.ceil(len(handles) / 24),
             title="colour, line style" if len(style_keys) > 1 else None, title_fontsize=7)
  fig.suptitle(suptitle)
  return fig


def run_lines(plt, labels: Sequence[str], rows: Sequence[tuple[str, str, Callable]], *, xlabel: str,
              suptitle: str | None, width: float = 6.5):
  """A figure of a line per run: one panel per entry of ``rows`` (``(title, y label, draw(ax, run,
  colour, line style))``, side by side) with the runs' legend, or, for more than
  :data:`FACET_ABOVE` runs that fall into families, a panel per family (:func:`facet_figure`)."""
  panels = facets(labels)
  if panels is not None:
    return facet_figure(plt, panels, rows, suptitle=suptitle or "", xlabel=xlabel)
  colors = run_colors(labels)
  fig, axes = plt.subplots(1, len(rows), figsize=(width * len(rows) if len(rows) > 1 else width, 3.8),
                           squeeze=False)
  for ax, (row_title, ylabel, draw) in zip(axes[0], rows, strict=True):
    for run in labels:
      draw(ax, run, colors[run], "-")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if row_title:
      ax.set_title(row_title, fontsize=10)
  legend(axes[0, 0])
  if suptitle:
    fig.suptitle(suptitle)
  return fig
