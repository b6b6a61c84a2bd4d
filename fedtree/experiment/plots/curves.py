"""Every run's metrics over rounds (or against the uplink or simulated time): the accuracy and
training loss, a language model's perplexity, the models of each run, keyword spotting's rates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fedtree.experiment.plots import figure
from fedtree.experiment.plots.panels import FACET_ABOVE, facet_figure, facets, run_lines
from fedtree.experiment.plots.records import curve, models_of, runs, time_curve
from fedtree.experiment.plots.style import LEGEND_INSIDE, LINE_STYLES, MARKERS, legend, run_colors


def plot_runs(records: Sequence[Mapping[str, Any]], path: str, *, metric: str = "accuracy",
              models: Sequence[str] | None = None, title: str | None = None,
              train_loss: bool = True, skip_frozen: bool = True,
              skip: Iterable[tuple[str, str]] = (),
              finals: Mapping[tuple[str, str], float] | None = None) -> str:
  """Every run's ``metric`` over rounds in one panel (a line per run and model: a colour per run,
  the same in both panels, a line style per model), and the training loss of every run beside
  it when ``train_loss``. More than :data:`FACET_ABOVE` runs that fall into families
  (:func:`facets`) are a panel per family instead, the metric above and the training loss below;
  rows averaged over seeds (:func:`seed_means`) get their ±std band.

  Args:
    records: from :func:`read_metrics`.
    path: the PNG to write.
    metric: the evaluated metric, reported as ``<model>/<metric>``.
    models: the models to draw (default: every model that reports ``metric``).
    title: the figure title (default: the metric's name).
    train_loss: add a panel with the clients' mean training loss per round.
    skip_frozen: leave out a model whose metric never changed over several reports (e.g. the
      root of a tree whose root never aggregates), which would only squash the other curves.
    skip: ``(run, model)`` pairs to leave out (e.g. the models a run's ``summary.json`` marks
      ``"trained": false``); when given, ``skip_frozen`` is not applied.
    finals: ``{(run, model): value}`` of models evaluated only at the end (e.g. the fine-tuned
      models of a report), drawn as a star at the run's last round.

  Returns:
    ``path``.
  """
  plt = figure.pyplot()
  skip = set(skip)
  finals = dict(finals or {})
  models = list(models) if models is not None else models_of(records, metric)
  labels = runs(records)

  def hidden(run: str, m: str, y: np.ndarray) -> bool:
    return (run, m) in skip or (not skip and skip_frozen and y.size > 1 and bool(np.all(y == y[0])))

  frozen = sum(1 for run in labels for m in models
               if curve(records, run, f"{m}/{metric}")[0].size
               and hidden(run, m, curve(records, run, f"{m}/{metric}")[1]))
  note = f"({frozen} model(s) that never trained left out)" if frozen else None
  shown = [run for run in labels if any(not hidden(run, m, y) and y.size for m in models
                                        for y in (curve(records, run, f"{m}/{metric}")[1],))]
  panels = facets(shown)
  if panels is not None:   # many runs: a panel per family, metric above and training loss below
    def draw_metric(ax, run, color, style):
      for i, m in enumerate(models):
        x, y = curve(records, run, f"{m}/{metric}")
        if x.size and not hidden(run, m, y):
          ax.plot(x, y, style, color=color, marker=MARKERS[i % len(MARKERS)], ms=2.5, lw=1.2)
          _band(ax, records, run, f"{m}/{metric}", color)
      for (r, _), value in finals.items():   # models evaluated only at the end: a star
        if r == run:
          last = max((int(row["round"]) for row in records if str(row["run"]) == run), default=0)
          ax.plot([last], [value], marker="*", ms=9, linestyle="none", color=color)

    def draw_loss(ax, run, color, style):
      x, y = curve(records, run, "train_loss")
      if x.size:
        ax.plot(x, y, style, color=color, lw=1.2)

    rows = [("", figure.metric_label(metric), draw_metric)]
    if train_loss:
      rows.append(("training loss", figure.metric_label("train_loss"), draw_loss))
    fig = facet_figure(plt, panels, rows, suptitle=(title or f"{figure.metric_label(metric)} of every run")
                        + (f"\n{note}" if note else ""))
    return figure.save(fig, path)
  colors = run_colors(labels)
  fig, axes = plt.subplots(1, 2 if train_loss else 1, figsize=(11 if train_loss else 6.5, 3.8),
                           squeeze=False)
  ax = axes[0, 0]
  for run in labels:
    for i, m in enumerate(models):
      x, y = curve(records, run, f"{m}/{metric}")
      if hidden(run, m, y):
        continue
      if x.size:
        ax.plot(x, y, LINE_STYLES[i % len(LINE_STYLES)], color=colors[run],
                marker=MARKERS[i % len(MARKERS)], ms=3, label=run if len(models) == 1 else f"{run} · {m}")
        _band(ax, records, run, f"{m}/{metric}", colors[run])
  for j, ((run, m), value) in enumerate(finals.items()):
    last = max((int(r["round"]) for r in records if str(r["run"]) == run), default=0)
    ax.plot([last], [value], marker="*", ms=11, linestyle="none", color=colors.get(run, "k"),
            markeredgecolor=f"C{(j + 3) % 10}", markeredgewidth=1.2, label=f"{run} · {m} (final)")
  ax.set_xlabel("round")
  ax.set_ylabel(figure.metric_label(metric))
  ax.set_title(f"{figure.metric_label(metric)} over rounds", fontsize=10)
  ax.grid(alpha=0.3)
  legend(ax, title=note)
  if train_loss:
    ax2 = axes[0, 1]
    for run in labels:
      x, y = curve(records, run, "train_loss")
      if x.size:
        ax2.plot(x, y, color=colors[run], label=run, marker="o" if x.size == 1 else None, ms=4)
        _band(ax2, records, run, "train_loss", colors[run])
    ax2.set_xlabel("round")
    ax2.set_ylabel(figure.metric_label("train_loss"))
    ax2.set_title("clients' mean training loss per round", fontsize=10)
    ax2.grid(alpha=0.3)
    if ax2.lines and len(ax2.lines) <= LEGEND_INSIDE and fig.get_layout_engine() is None:
      ax2.legend(fontsize=7)
  fig.suptitle(title or f"{figure.metric_label(metric)} of every run")
  return figure.save(fig, path)


def _band(ax, records: Sequence[Mapping[str, Any]], run: str, key: str, color) -> None:
  """The ±std band of ``key`` over seeds (``<key>:std``, :func:`seed_means`), when the rows have it."""
  x, y = curve(records, run, key)
  xs, sd = curve(records, run, f"{key}:std")
  if x.size and xs.size == x.size and np.any(sd > 0):
    ax.fill_between(x, y - sd, y + sd, color=color, alpha=0.15, linewidth=0)


def plot_accuracy_vs_uplink(records: Sequence[Mapping[str, Any]], path: str, *, metric: str = "accuracy",
                            model: str = "global", title: str | None = None,
                            skip: Iterable[str] = ()) -> str:
  """Every run's ``<model>/<metric>`` against the megabytes its clients had sent so far
  (``uplink_MB``, :mod:`fedtree.toolbox.traffic`), a line per run, the x axis on a log
  scale: what a compressor buys for the accuracy it costs.

  Args:
    records: from :func:`read_metrics`.
    path: the PNG to write.
    metric: the evaluated metric.
    model: the model whose metric is drawn.
    title: the figure title.
    skip: runs to leave out (e.g. those whose ``model`` never trained).

  Returns:
    ``path``.
  """
  plt = figure.pyplot()
  key = f"{model}/{metric}"
  skip = set(skip)
  pts = {run: sorted((float(r["uplink_MB"]), float(r[key])) for r in records
                     if str(r["run"]) == run and r.get(key) is not None and r.get("uplink_MB") is not None)
         for run in runs(records) if run not in skip}
  labels = [run for run, p in pts.items() if p]

  def draw(ax, run, color, style):
    from matplotlib.ticker import NullFormatter

    x, y = zip(*pts[run], strict=True)
    ax.plot(x, y, style, color=color, marker="o", ms=3, label=run)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())

  fig = run_lines(plt, labels, [("", figure.metric_label(metric), draw)], xlabel="cumulative uplink (MB)",
                  suptitle=title or (f"{model} model: {figure.metric_label(metric)} against the uplink"
                                     if len(labels) > FACET_ABOVE else None))
  return figure.save(fig, path)


def plot_time_to_accuracy(records: Sequence[Mapping[str, Any]], path: str, *, metric: str = "accuracy",
                          model: str = "global", time_key: str = "sim_seconds",
                          target: float | None = None, title: str | None = None) -> str:
  """Every run's ``<model>/<metric>`` against simulated hours (the runs' ``time_key`` clock,
  e.g. under deadlines, over-selection or FedBuff), with a dotted line at ``target``.

  Returns:
    ``path``.
  """
  plt = figure.pyplot()
  key = f"{model}/{metric}"
  labels = [run for run in runs(records) if time_curve(records, run, key, time_key=time_key)[0].size]

  def draw(ax, run, color, style):
    x, y = time_curve(records, run, key, time_key=time_key)
    ax.plot(x, y, style, color=color, marker="o", ms=2.5, label=run)
    if target is not None:
      ax.axhline(target, color="gray", ls=":", lw=1)

  fig = run_lines(plt, labels, [(title or "", figure.metric_label(metric), draw)], xlabel="simulated hours",
                  suptitle=None)
  return figure.save(fig, path)


def plot_perplexity(records: Sequence[Mapping[str, Any]], path: str, *, title: str | None = None) -> str:
  """A language model's test perplexity over rounds, log scale: token level (``<model>/perplexity``)
  and, when reported, sentence level (``<model>/sentence_perplexity``) in a second panel; a line
  per run and model."""
  plt = figure.pyplot()
  metrics = [m for m in ("perplexity", "sentence_perplexity") if models_of(records, m)]
  fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 3.8), squeeze=False)
  colors = run_colors(runs(records))
  for ax, metric in zip(axes[0], metrics, strict=True):
    models = models_of(records, metric)
    for run in runs(records):
      for i, m in enumerate(models):
        x, y = curve(records, run, f"{m}/{metric}")
        if x.size:
          ax.plot(x, y, LINE_STYLES[i % len(LINE_STYLES)], color=colors[run],
                  marker=MARKERS[i % len(MARKERS)], ms=3, label=run if len(models) == 1 else f"{run} · {m}")
    ax.set_xlabel("round")
    ax.set_ylabel(figure.metric_label(metric))
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
  legend(axes[0, 0])
  fig.suptitle(title or "test perplexity (lower is better)")
  return figure.save(fig, path)


def plot_models_per_run(records: Sequence[Mapping[str, Any]], path: str, *, metric: str = "accuracy",
                        title: str | None = None, skip: Iterable[tuple[str, str]] = ()) -> str:
  """A panel per run with a line per model it reports (the levels of a tree: ``global``,
  ``level1``, ...; or global, team and personal models; or cluster models), on a shared y axis;
  ``skip``: ``(run, model)`` pairs to leave out (models that never trained). Many runs are drawn
  in smaller panels, 6 a line."""
  plt = figure.pyplot()
  skip = set(skip)
  labels = runs(records)
  many = len(labels) > FACET_ABOVE
  fig, axes = figure.grid(plt, len(labels), width=2.8 if many else 4.2, height=2.2 if many else 3.0,
                    max_cols=6 if many else 3)
  left_out = []
  for ax, run in zip(axes, labels, strict=True):
    for m in models_of([r for r in records if str(r["run"]) == run], metric):
      if (run, m) in skip:
        left_out.append(f"{run} {m}")
        continue
      x, y = curve(records, run, f"{m}/{metric}")
      ax.plot(x, y, marker="o", ms=3, label=m)
    ax.set_title(run, fontsize=8 if many else 10)
    ax.set_xlabel("round", fontsize=8)
    ax.set_ylabel(figure.metric_label(metric), fontsize=8)
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=6 if many else 7)
  figure.share_y(axes)
  head = title or f"{figure.metric_label(metric)} of every model, a panel per run"
  fig.suptitle(head + (f"\n(never trained, left out: {', '.join(left_out)})" if left_out else ""),
               fontsize=10 if left_out else None)
  return figure.save(fig, path)


def plot_keyword_rates(records: Sequence[Mapping[str, Any]], path: str, *, model: str = "global",
                       title: str | None = None) -> str:
  """False-accept and false-reject rates of ``model`` over rounds, a line per run (paper 002)."""
  plt = figure.pyplot()
  labels = [run for run in runs(records)
            if curve(records, run, f"{model}/false_accept_rate")[0].size]

  def rate(metric):
    def draw(ax, run, color, style):
      x, y = curve(records, run, f"{model}/{metric}")
      if x.size:
        ax.plot(x, 100 * y, style, color=color, marker="o", ms=3, label=run)
    return (f"{figure.metric_label(metric)} of the {model} model (lower is better)",
            figure.metric_label(metric) + " (%)", draw)

  fig = run_lines(plt, labels, [rate("false_accept_rate"), rate("false_reject_rate")], xlabel="round",
                  suptitle=title or "keyword spotting: false accepts and false rejects", width=5.5)
  return figure.save(fig, path)
