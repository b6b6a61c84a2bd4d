"""The picture of a moving membership: every client's edge over rounds, and every edge's load."""

from __future__ import annotations

import numpy as np

from fedtree.experiment.plots import figure


def plot_membership(edges, up, path: str, *, title: str | None = None) -> str:
  """Top: every client's edge in every round (a row per client, ordered by its edge in round 1; a colour
  per edge, black while its edge is down and it waits). Bottom: the clients on every edge over rounds,
  its down rounds shaded. ``edges``: ``int[R, C]``, ``up``: ``bool[R, E]`` (a
  :class:`~fedtree.core.membership.Membership`'s, or ``membership_<run>.npz``'s)."""
  plt = figure.pyplot()
  from matplotlib.colors import ListedColormap

  edges, up = np.asarray(edges), np.asarray(up, bool)
  rounds, _ = edges.shape
  num_edges = up.shape[1]
  order = np.lexsort((np.arange(edges.shape[1]), edges[0]))
  colours = [plt.get_cmap("tab10" if num_edges <= 10 else "tab20")(g % 20) for g in range(num_edges)]
  cmap = ListedColormap(colours + [(0.0, 0.0, 0.0, 1.0)])
  shown = np.where(np.take_along_axis(up, edges, axis=1), edges, num_edges)[:, order].T
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 5.2), sharex=True, height_ratios=(3, 2))
  top.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap, vmin=-0.5, vmax=num_edges + 0.5,
             extent=(0.5, rounds + 0.5, len(order) - 0.5, -0.5))
  top.set_ylabel("client (by its edge in round 1)")
  x = np.arange(1, rounds + 1)
  for g in range(num_edges):
    load = (edges == g).sum(axis=1)
    bottom.step(x, load, where="mid", color=colours[g], label=f"edge {g}")
    for r in np.flatnonzero(~up[:, g]):
      bottom.axvspan(r + 0.5, r + 1.5, color=colours[g], alpha=0.15, linewidth=0)
  bottom.set_xlabel("round")
  bottom.set_ylabel("clients on the edge")
  bottom.grid(alpha=0.3)
  bottom.legend(fontsize=7, ncol=min(num_edges, 5), loc="upper right")
  top.set_title(title or "membership over rounds (black: waiting for a down edge)")
  return figure.save(fig, path)
