"""Pictures of results: metrics over rounds, per-client distributions, clusters, throughput.

Pure functions from data to a PNG file whose path the caller gives; each returns that path.
matplotlib is imported when a picture is drawn (with the non-interactive ``Agg`` backend when no
backend was chosen yet), never when this module is imported, so nothing in fedtree needs it to
train. Install it with ``pip install -e ".[plot]"``.

The inputs are what a run writes: ``<workdir>/metrics.jsonl`` (one JSON object a report:
``{"run": label, "round": r, "train_loss": ..., "<model>/<metric>": ...}``, where ``<model>``
is a name from ``algorithm.models(state)``: ``global``, ``level1``, ... for the levels of a
tree, ``personal``, ``cluster``, ...) and ``<workdir>/summary.json`` (``{run: {model:
summary}}`` with ``client_accuracy`` per client), and the benchmark results
``benchmarks/results/*.json``. :func:`write_run_plots` draws every picture a workdir allows:

Examples:
  >>> import json, os, tempfile
  >>> workdir = tempfile.mkdtemp()
  >>> with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
  ...   for r in (10, 20, 30):
  ...     _ = f.write(json.dumps({"run": "fedavg", "round": r, "train_loss": 1 / r,
  ...                             "global/accuracy": 0.5 + r / 100}) + "\\n")
  >>> [os.path.basename(p) for p in write_run_plots(workdir)]
  ['plot_accuracy.png']
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

Curve = tuple[np.ndarray, np.ndarray]  # (rounds int[R], values float[R])

# ------------------------------------------------------------------------ reading


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The records of a ``metrics.jsonl`` file (or of ``<path>/metrics.jsonl`` for a directory).

  A resumed run appends to the file; where a ``(run, round)`` pair repeats, the last record wins.
  Blank or truncated lines (a run killed while writing) are skipped. The rows of a sweep (one per
  experiment and round, with ``setting`` and ``seed``) become a run each, labelled by the sweep's
  run and the setting (``"fedprox [mu=0.1]"``; ``"... seed 1"`` when the sweep has several
  seeds; a run swept over seeds alone is ``"fedprox seed 1"``), so that every experiment is its
  own curve (:func:`plot_sweep` draws the mean over seeds, :func:`seed_means` averages them), with
  its sweep's run label as ``sweep_run``.
  """
  if os.path.isdir(path):
    path = os.path.join(path, "metrics.jsonl")
  records: dict[tuple[str, Any, int], dict[str, Any]] = {}
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        continue
      if "run" in rec and "round" in rec:
        records[(str(rec["run"]), rec.get("experiment"), int(rec["round"]))] = rec
  seeds: dict[str, set[Any]] = {}
  for rec in records.values():
    if "setting" in rec:
      seeds.setdefault(_sweep_run(rec), set()).add(rec.get("seed"))
  out = []
  for rec in records.values():
    if "setting" in rec:
      base = _sweep_run(rec)
      label = f"{base} [{setting_label(rec['setting'])}]" if rec["setting"] else base
      rec = {**rec, "run": label if len(seeds[base]) == 1 else f"{label} seed {rec.get('seed')}",
             "sweep_run": base}
    out.append(rec)
  return out


def _sweep_run(rec: Mapping[str, Any]) -> str:
  """The run a sweep's row belongs to (its label without a ``#chunk<k>`` of a chunked sweep)."""
  return str(rec["run"]).split("#chunk", 1)[0]


def setting_label(setting: Mapping[str, Any]) -> str:
  """``{"runs.fedprox.mu": 0.1}`` -> ``"mu=0.1"``: a sweep setting in a legend."""
  return ",".join(f"{k.rsplit('.', 1)[-1]}={v:g}" for k, v in sorted(setting.items())) or "default"


def runs(records: Iterable[Mapping[str, Any]]) -> list[str]:
  """Run labels in order of first appearance."""
  return list(dict.fromkeys(str(r["run"]) for r in records))


def models_of(records: Iterable[Mapping[str, Any]], metric: str = "accuracy") -> list[str]:
  """Model names that report ``metric`` (keys ``<model>/<metric>``), in order of appearance."""
  suffix = "/" + metric
  return list(dict.fromkeys(k[: -len(suffix)] for r in records for k in r if k.endswith(suffix)))


def curve(records: Iterable[Mapping[str, Any]], run: str, key: str) -> Curve:
  """``(rounds, values)`` of ``key`` (e.g. ``"global/accuracy"`` or ``"train_loss"``) in ``run``,
  sorted by round; reports without the key (or with ``null``) are left out."""
  pts = sorted((int(r["round"]), float(r[key])) for r in records
               if str(r["run"]) == run and r.get(key) is not None and not isinstance(r[key], list))
  if not pts:
    return np.zeros(0, np.int64), np.zeros(0)
  rounds, values = zip(*pts, strict=True)
  return np.asarray(rounds), np.asarray(values)


# ------------------------------------------------------------------------ drawing helpers


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


def _grid(plt, n: int, width: float = 4.2, height: float = 3.0, max_cols: int = 3):
  cols = min(n, max_cols)
  rows = math.ceil(n / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
  for ax in axes.flat[n:]:
    ax.set_visible(False)
  return fig, list(axes.flat[:n])


def run_colors(labels: Iterable[str]) -> dict[str, Any]:
  """A colour per run label, the same in every panel: matplotlib's ``C0``...``C9`` in order for up
  to 10 runs, distinct colours beyond (:func:`_palette`)."""
  return _palette(labels)


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "x")

# ------------------------------------------------------------------------ many runs
LEGEND_INSIDE = 8
"""Legend entries a panel holds inside; with more, the legend goes outside, right of the panels."""
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


def _palette(names: Iterable[str]) -> dict[str, Any]:
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


def _legend(ax, *, title: str | None = None, handles=None, labels=None) -> None:
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


def _facet_figure(plt, panels: Mapping[str, list[str]], rows: Sequence[tuple[str, str, Callable]], *,
                  suptitle: str, xlabel: str = "round"):
  """A grid of panels: a column per family of runs (``panels``, :func:`facets`) and a row per entry
  of ``rows`` (``(row title, y label, draw(ax, run, colour, line style))``; with more than 6
  families, the first row only, wrapped 4 panels a line). A run's colour is its second word and
  its line style the rest (``signflip_median_30``: median, 30), the same in every panel, explained
  by one legend outside. Returns the figure."""
  from matplotlib.lines import Line2D

  keys = {run: _words(run, panel) for panel, members in panels.items() for run in members}
  colors = _palette(k for k, _ in keys.values())
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


def seed_means(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The rows of a sweep over several seeds (``setting`` and ``seed``, :func:`read_metrics`'s
  ``"<run> [<setting>] seed <s>"`` runs) as one run per setting: every number the mean over
  seeds, its spread as ``<key>:std``, labelled ``"<run> [<setting>] (mean of N seeds)"``; other
  rows unchanged. What a picture of many seeds draws (a line per setting, not per seed)."""
  groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
  out: list[dict[str, Any]] = []
  for r in records:
    label = str(r["run"])
    if "setting" not in r or " seed " not in label:
      out.append(dict(r))
      continue
    groups.setdefault((label.rsplit(" seed ", 1)[0], int(r["round"])), []).append(r)
  seeds: dict[str, set] = {}
  for (base, _), rows in groups.items():
    seeds.setdefault(base, set()).update(r.get("seed") for r in rows)
  for (base, rnd), rows in groups.items():
    row: dict[str, Any] = {"run": f"{base} (mean of {len(seeds[base])} seeds)", "round": rnd,
                           "sweep_run": rows[0].get("sweep_run"), "setting": rows[0]["setting"]}
    keys = dict.fromkeys(k for r in rows for k, v in r.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)
                         and k not in ("round", "seed", "experiment"))
    for k in keys:
      vals = np.asarray([float(r[k]) for r in rows if isinstance(r.get(k), (int, float))], np.float64)
      row[k] = float(vals.mean())
      row[f"{k}:std"] = float(vals.std())
    out.append(row)
  return out


def _label_metric(metric: str) -> str:
  return {"accuracy": "test accuracy", "loss": "test loss", "train_loss": "training loss",
          "false_accept_rate": "false-accept rate", "false_reject_rate": "false-reject rate",
          "intra_cluster_accuracy": "intra-cluster accuracy",
          "inter_cluster_accuracy": "inter-cluster accuracy",
          "perplexity": "test perplexity (token level)",
          "sentence_perplexity": "test perplexity (sentence level)"}.get(metric, metric.replace("_", " "))


# ------------------------------------------------------------------------ metrics over rounds


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
  plt = pyplot()
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

    rows = [("", _label_metric(metric), draw_metric)]
    if train_loss:
      rows.append(("training loss", _label_metric("train_loss"), draw_loss))
    fig = _facet_figure(plt, panels, rows, suptitle=(title or f"{_label_metric(metric)} of every run")
                        + (f"\n{note}" if note else ""))
    return save(fig, path)
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
  ax.set_ylabel(_label_metric(metric))
  ax.set_title(f"{_label_metric(metric)} over rounds", fontsize=10)
  ax.grid(alpha=0.3)
  _legend(ax, title=note)
  if train_loss:
    ax2 = axes[0, 1]
    for run in labels:
      x, y = curve(records, run, "train_loss")
      if x.size:
        ax2.plot(x, y, color=colors[run], label=run, marker="o" if x.size == 1 else None, ms=4)
        _band(ax2, records, run, "train_loss", colors[run])
    ax2.set_xlabel("round")
    ax2.set_ylabel(_label_metric("train_loss"))
    ax2.set_title("clients' mean training loss per round", fontsize=10)
    ax2.grid(alpha=0.3)
    if ax2.lines and len(ax2.lines) <= LEGEND_INSIDE and fig.get_layout_engine() is None:
      ax2.legend(fontsize=7)
  fig.suptitle(title or f"{_label_metric(metric)} of every run")
  return save(fig, path)


def _band(ax, records: Sequence[Mapping[str, Any]], run: str, key: str, color) -> None:
  """The ±std band of ``key`` over seeds (``<key>:std``, :func:`seed_means`), when the rows have it."""
  x, y = curve(records, run, key)
  xs, sd = curve(records, run, f"{key}:std")
  if x.size and xs.size == x.size and np.any(sd > 0):
    ax.fill_between(x, y - sd, y + sd, color=color, alpha=0.15, linewidth=0)


def _lines(plt, labels: Sequence[str], rows: Sequence[tuple[str, str, Callable]], *, xlabel: str,
           suptitle: str | None, width: float = 6.5):
  """A figure of a line per run: one panel per entry of ``rows`` (``(title, y label, draw(ax, run,
  colour, line style))``, side by side) with the runs' legend, or, for more than
  :data:`FACET_ABOVE` runs that fall into families, a panel per family (:func:`_facet_figure`)."""
  panels = facets(labels)
  if panels is not None:
    return _facet_figure(plt, panels, rows, suptitle=suptitle or "", xlabel=xlabel)
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
  _legend(axes[0, 0])
  if suptitle:
    fig.suptitle(suptitle)
  return fig


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
  plt = pyplot()
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

  fig = _lines(plt, labels, [("", _label_metric(metric), draw)], xlabel="cumulative uplink (MB)",
               suptitle=title or (f"{model} model: {_label_metric(metric)} against the uplink"
                                  if len(labels) > FACET_ABOVE else None))
  return save(fig, path)


def fairness_keys(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
  """``(model, metric)`` pairs whose per-client spread the rows report over rounds
  (``<model>/<metric>_worst10_mean``, the runner's per-round fairness), in order of appearance."""
  suffix = "_worst10_mean"
  keys = dict.fromkeys(k[: -len(suffix)] for r in records for k in r if k.endswith(suffix) and "/" in k)
  return [tuple(k.split("/", 1)) for k in keys]   # type: ignore[misc]


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
  plt = pyplot()
  skip = set(skip)
  key = f"{model}/{metric}"
  labels = [r for r in runs(records) if r not in skip and curve(records, r, f"{key}_p50")[0].size]
  scale = "log" if metric == "perplexity" else "linear"
  default = f"{model}: {_label_metric(metric)} per client (band: 10th–90th percentile)"

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

    fig = _lines(plt, labels, [("median client", _label_metric(metric), median),
                               ("worst 10 % of clients", _label_metric(metric), worst)],
                 xlabel="round", suptitle=title or f"{model}: {_label_metric(metric)} per client")
    return save(fig, path)
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
  return save(fig, path)


def _finish_curves(ax, xlabel: str, metric: str) -> None:
  """Axis labels, a light grid and, when something was drawn, the runs' legend (:func:`_legend`)."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(_label_metric(metric))
  ax.grid(alpha=0.3)
  _legend(ax)


def time_curve(records: Iterable[Mapping[str, Any]], run: str, key: str, *,
               time_key: str = "sim_seconds") -> Curve:
  """``(simulated hours, values)`` of ``key`` in ``run``: the reports that carry both ``key`` and
  the simulated clock ``time_key`` (seconds; :mod:`fedtree.toolbox.systems`), sorted by time."""
  pts = sorted((float(r[time_key]) / 3600.0, float(r[key])) for r in records
               if str(r["run"]) == run and r.get(key) is not None and r.get(time_key) is not None
               and not isinstance(r[key], list))
  if not pts:
    return np.zeros(0), np.zeros(0)
  hours, values = zip(*pts, strict=True)
  return np.asarray(hours), np.asarray(values)


def time_to_target(records: Iterable[Mapping[str, Any]], run: str, key: str, target: float, *,
                   time_key: str = "sim_seconds") -> float | None:
  """The first simulated hour at which ``key`` of ``run`` reached ``target`` (``None``: never).

  Example:
    >>> recs = [{"run": "a", "round": r, "sim_seconds": 1800.0 * r, "global/accuracy": 0.2 * r}
    ...         for r in (1, 2, 3)]
    >>> time_to_target(recs, "a", "global/accuracy", 0.4), time_to_target(recs, "a", "global/accuracy", 0.9)
    (1.0, None)
  """
  hours, values = time_curve(records, run, key, time_key=time_key)
  hit = np.flatnonzero(values >= target)
  return float(hours[hit[0]]) if hit.size else None


def plot_time_to_accuracy(records: Sequence[Mapping[str, Any]], path: str, *, metric: str = "accuracy",
                          model: str = "global", time_key: str = "sim_seconds",
                          target: float | None = None, title: str | None = None) -> str:
  """Every run's ``<model>/<metric>`` against simulated hours (the runs' ``time_key`` clock,
  e.g. under deadlines, over-selection or FedBuff), with a dotted line at ``target``.

  Returns:
    ``path``.
  """
  plt = pyplot()
  key = f"{model}/{metric}"
  labels = [run for run in runs(records) if time_curve(records, run, key, time_key=time_key)[0].size]

  def draw(ax, run, color, style):
    x, y = time_curve(records, run, key, time_key=time_key)
    ax.plot(x, y, style, color=color, marker="o", ms=2.5, label=run)
    if target is not None:
      ax.axhline(target, color="gray", ls=":", lw=1)

  fig = _lines(plt, labels, [(title or "", _label_metric(metric), draw)], xlabel="simulated hours",
               suptitle=None)
  return save(fig, path)


def plot_perplexity(records: Sequence[Mapping[str, Any]], path: str, *, title: str | None = None) -> str:
  """A language model's test perplexity over rounds, log scale: token level (``<model>/perplexity``)
  and, when reported, sentence level (``<model>/sentence_perplexity``) in a second panel; a line
  per run and model."""
  plt = pyplot()
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
    ax.set_ylabel(_label_metric(metric))
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
  _legend(axes[0, 0])
  fig.suptitle(title or "test perplexity (lower is better)")
  return save(fig, path)


def plot_models_per_run(records: Sequence[Mapping[str, Any]], path: str, *, metric: str = "accuracy",
                        title: str | None = None, skip: Iterable[tuple[str, str]] = ()) -> str:
  """A panel per run with a line per model it reports (the levels of a tree: ``global``,
  ``level1``, ...; or global, team and personal models; or cluster models), on a shared y axis;
  ``skip``: ``(run, model)`` pairs to leave out (models that never trained). Many runs are drawn
  in smaller panels, 6 a line."""
  plt = pyplot()
  skip = set(skip)
  labels = runs(records)
  many = len(labels) > FACET_ABOVE
  fig, axes = _grid(plt, len(labels), width=2.8 if many else 4.2, height=2.2 if many else 3.0,
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
    ax.set_ylabel(_label_metric(metric), fontsize=8)
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=6 if many else 7)
  _share_y(axes)
  head = title or f"{_label_metric(metric)} of every model, a panel per run"
  fig.suptitle(head + (f"\n(never trained, left out: {', '.join(left_out)})" if left_out else ""),
               fontsize=10 if left_out else None)
  return save(fig, path)


def plot_clusters(records: Sequence[Mapping[str, Any]], path: str, *, title: str | None = None) -> str:
  """Intra- vs inter-cluster accuracy over rounds (paper 004): a panel per run that reports
  them, solid intra, dashed inter, a colour per clustered model."""
  plt = pyplot()
  labels = [r for r in runs(records) if models_of([x for x in records if x["run"] == r],
                                                  "intra_cluster_accuracy")]
  fig, axes = _grid(plt, max(1, len(labels)))
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
  _share_y(axes)
  fig.suptitle(title or "intra-cluster (solid) vs inter-cluster (dashed) accuracy")
  return save(fig, path)


def plot_cluster_tradeoff(points: Mapping[str, tuple[float, float]], path: str, *,
                          title: str | None = None) -> str:
  """Final intra- against inter-cluster accuracy, a labelled point per run (paper 004's Table 1
  β sweep as a picture). ``points``: ``{label: (intra, inter)}``."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5.2, 4.2))
  for i, (label, (intra, inter)) in enumerate(points.items()):
    ax.scatter([inter], [intra], color=f"C{i % 10}", s=40)
    ax.annotate(label, (inter, intra), textcoords="offset points", xytext=(5, 4 - 11 * (i % 3)),
                fontsize=8)
  ax.set_xlabel("inter-cluster accuracy")
  ax.set_ylabel("intra-cluster accuracy")
  ax.grid(alpha=0.3)
  ax.set_title(title or "intra- vs inter-cluster accuracy")
  return save(fig, path)


def plot_keyword_rates(records: Sequence[Mapping[str, Any]], path: str, *, model: str = "global",
                       title: str | None = None) -> str:
  """False-accept and false-reject rates of ``model`` over rounds, a line per run (paper 002)."""
  plt = pyplot()
  labels = [run for run in runs(records)
            if curve(records, run, f"{model}/false_accept_rate")[0].size]

  def rate(metric):
    def draw(ax, run, color, style):
      x, y = curve(records, run, f"{model}/{metric}")
      if x.size:
        ax.plot(x, 100 * y, style, color=color, marker="o", ms=3, label=run)
    return (f"{_label_metric(metric)} of the {model} model (lower is better)",
            _label_metric(metric) + " (%)", draw)

  fig = _lines(plt, labels, [rate("false_accept_rate"), rate("false_reject_rate")], xlabel="round",
               suptitle=title or "keyword spotting: false accepts and false rejects", width=5.5)
  return save(fig, path)


# ------------------------------------------------------------------------ per-client distributions


def plot_client_histograms(values: Mapping[str, Sequence[float]], path: str, *,
                           xlabel: str = "test accuracy of a client", bins: int = 20,
                           title: str | None = None, max_cols: int = 4) -> str:
  """Per-client distributions: a panel per label (a filled histogram with its mean marked), on
  shared bins and axes so the panels compare at a glance (NaN entries, i.e. clients without
  test data, are dropped). ``values``: ``{label: float[C]}``."""
  plt = pyplot()
  arrays = {k: np.asarray(v, np.float64) for k, v in values.items()}
  arrays = {k: v[np.isfinite(v)] for k, v in arrays.items()}
  pooled = np.concatenate([v for v in arrays.values() if v.size] or [np.zeros(1)])
  lo, hi = float(pooled.min()), float(pooled.max())
  edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
  fig, axes = _grid(plt, max(1, len(arrays)), width=3.4, height=2.6, max_cols=max_cols)
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
  return save(fig, path)


def plot_client_boxes(values: Mapping[str, Sequence[float]], path: str, *,
                      xlabel: str = "test accuracy of a client", title: str | None = None) -> str:
  """Per-client distributions of many runs, a horizontal box per label (median, quartiles, the
  10th-90th percentile whiskers, the mean as a dot), in the order given: what
  :func:`plot_client_histograms` becomes when a panel per label would be too many.
  ``values``: ``{label: float[C]}`` (NaN entries dropped)."""
  plt = pyplot()
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
  return save(fig, path)


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
  plt = pyplot()
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
    ax.set_title(f"{model} model: final {_label_metric(metric)} (%)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
  fig.suptitle(title or "every run's final result, a cell per run (blank: no such run)", fontsize=10)
  return save(fig, path)


def fairness_series(summary: Mapping[str, Any], max_series: int = 6,
                    skip: Iterable[tuple[str, str]] = ()) -> dict[str, tuple[np.ndarray, Mapping[str, Any]]]:
  """``{"run · model": (per-client values float[C], fairness dict)}`` of a ``summary.json``:
  every model with a ``fairness`` entry (:func:`fedtree.core.metrics.client_distribution`) and
  its per-client accuracy (``client_perplexity`` when the fairness metric is perplexity), not
  in ``skip`` and not equal to an earlier model's of the same run, at most ``max_series``."""
  skip = set(skip)
  out: dict[str, tuple[np.ndarray, Mapping[str, Any]]] = {}
  for run, models in summary.items():
    if not isinstance(models, Mapping):
      continue
    seen: list[np.ndarray] = []
    for name, s in models.items():
      if (run, name) in skip or not isinstance(s, Mapping) or not isinstance(s.get("fairness"), Mapping):
        continue
      fair = s["fairness"]
      values = s.get(f"client_{fair.get('metric', 'accuracy')}")
      if not isinstance(values, list):
        continue
      v = np.asarray([np.nan if a is None else a for a in values], np.float64)
      if any(v.shape == u.shape and np.allclose(v, u, equal_nan=True) for u in seen):
        continue
      seen.append(v)
      out[f"{run} · {name}" if len(models) > 1 else str(run)] = (v, fair)
  return dict(list(out.items())[:max_series])


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
  plt = pyplot()
  if len(series) > 6:
    return _fairness_chart(plt, series, path, title=title)
  fig, axes = _grid(plt, len(series), width=4.4, height=3.0)
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
  return save(fig, path)


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
  return save(fig, path)


def plot_relative_change(baseline: Sequence[float], new: Sequence[float], path: str, *,
                         lower_is_better: bool = True, names: tuple[str, str] = ("PerFL", "GroupPerFL"),
                         metric: str = "perplexity", bins: int = 30) -> str:
  """Histogram of the per-client relative change ``(new - baseline) / baseline`` in % (paper
  000's Fig. 1: GroupPerFL vs PerFL perplexity), with the share of clients that improve."""
  plt = pyplot()
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
  return save(fig, path)


def plot_group_bars(values: Mapping[str, Sequence[float]], path: str, *,
                    group_names: Sequence[str] | None = None, ylabel: str = "test accuracy",
                    title: str | None = None) -> str:
  """Grouped bars: a bar per label within every group (e.g. accuracy by group per method, or
  accuracy by tree level on clients' and central data). ``values``: ``{label: float[G]}``."""
  plt = pyplot()
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
  return save(fig, path)


# ------------------------------------------------------------------------ throughput


def plot_throughput(results: Sequence[Mapping[str, Any]], path: str, *, title: str | None = None) -> str:
  """Client updates per second against the number of clients, a line per framework label, a
  panel per benchmark workload (the ``results`` list of ``benchmarks/results/<tag>.json``;
  skipped entries are left out)."""
  plt = pyplot()
  ok = [r for r in results if "skipped" not in r and r.get("client_updates_per_s")]
  workloads = list(dict.fromkeys(r["workload"]["name"] for r in ok))
  fig, axes = _grid(plt, max(1, len(workloads)), width=4.6, height=3.6)
  for ax, w in zip(axes, workloads, strict=False):
    mine = [r for r in ok if r["workload"]["name"] == w]
    labels = list(dict.fromkeys(r["label"] for r in mine))
    sizes = sorted({r["workload"]["num_clients"] for r in mine})
    model = mine[0]["workload"]["model"]
    if len(sizes) == 1:  # one size: a bar per framework
      ys = [next(r["client_updates_per_s"] for r in mine if r["label"] == lab) for lab in labels]
      ax.bar(range(len(labels)), ys, color=[f"C{i % 10}" for i in range(len(labels))])
      ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=20)
      ax.set_xlabel(f"{sizes[0]:,} clients per round")
    else:
      for label in labels:
        pts = sorted((r["workload"]["num_clients"], r["client_updates_per_s"]) for r in mine
                     if r["label"] == label)
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, marker="o", label=label)
      ax.set_xscale("log")
      ax.set_yscale("log")
      ax.set_xlabel("clients per round")
      ax.legend(fontsize=7)
    ax.set_ylabel("client updates / s")
    ax.set_title(f"workload {w}: {model}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
  fig.suptitle(title or "throughput (higher is better)")
  return save(fig, path)


def plot_scaling(scaling: Mapping[str, Any], path: str, *, title: str | None = None) -> str:
  """``benchmarks/results/scaling.json``: seconds per round against the cohort size (log-log,
  with the linear reference) and against the tree depth."""
  plt = pyplot()
  fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 3.8))
  cs = sorted(scaling.get("cohort_sweep", []), key=lambda r: r["cohort"])
  if cs:
    k = np.asarray([r["cohort"] for r in cs], np.float64)
    t = np.asarray([r["seconds_per_round"] for r in cs])
    a.loglog(k, t, "o-", label="fedtree")
    a.loglog(k, t[0] * k / k[0], "k:", label="linear in the cohort")
    a.legend(fontsize=8)
  a.set_xlabel("cohort size (clients per round)")
  a.set_ylabel("seconds per round")
  a.set_title(f"population {scaling.get('population', '?'):,}" if isinstance(
    scaling.get("population"), int) else "cohort sweep", fontsize=10)
  a.grid(alpha=0.3, which="both")
  ds = sorted(scaling.get("depth_sweep", []), key=lambda r: r["depth"])
  b.bar([str(r["depth"]) for r in ds], [1e3 * r["seconds_per_round"] for r in ds])
  b.set_xlabel("server levels above the clients")
  b.set_ylabel("ms per round")
  b.set_title("tree depth", fontsize=10)
  b.grid(alpha=0.3, axis="y")
  fig.suptitle(title or "scaling")
  return save(fig, path)


def plot_benchmark_file(json_path: str, path: str) -> str:
  """Draws a ``benchmarks/results/*.json`` file: :func:`plot_scaling` for a scaling sweep,
  :func:`plot_throughput` for a throughput comparison."""
  with open(json_path) as f:
    data = json.load(f)
  if "cohort_sweep" in data or "depth_sweep" in data:
    return plot_scaling(data, path)
  return plot_throughput(data["results"], path, title=os.path.basename(json_path))


# ------------------------------------------------------------------------ a workdir


def write_run_plots(workdir: str) -> list[str]:
  """Every picture ``<workdir>/metrics.jsonl`` (and ``summary.json`` where present) allows,
  written into ``workdir``; returns the paths written.

  * ``plot_accuracy.png``: every run's test accuracy over rounds (a line per run and model) and
    its training loss;
  * ``plot_models.png``: a panel per run, a line per model (tree levels, team/personal models,
    clusters), when some run reports more than one model;
  * ``plot_accuracy_uplink.png``: the global model's test accuracy against the cumulative
    uplink megabytes, when the metrics count them;
  * ``plot_perplexity.png``: a language model's test perplexity over rounds (token level, log
    scale; the sentence level beside it when reported);
  * ``plot_clusters.png``: intra- vs inter-cluster accuracy, when reported;
  * ``plot_keyword_rates.png``: false-accept/false-reject rates, when reported;
  * ``plot_client_accuracy.png``: the distribution of the final per-client test accuracy of
    every run's models, a panel each (from ``summary.json``);
  * ``plot_client_fairness.png``: the same per model, with its percentiles, worst-10 % mean and
    Gini coefficient (:func:`plot_client_fairness`);
  * ``plot_fairness_rounds.png``: the global model's median client, worst 10 % and 10th–90th
    percentile band over rounds, per run (:func:`plot_fairness_over_rounds`), when the rows
    report them;
  * ``plot_time_accuracy.png``: the global model's accuracy against simulated hours, when runs
    report a simulated clock (``sim_seconds``, :mod:`fedtree.toolbox.systems`);
  * ``plot_final_table.png``: for more than :data:`FACET_ABOVE` runs whose labels form a table
    (:func:`grid_of`, e.g. ``{attack}_{defence}_{percent}``), the global model's final accuracy
    (and attack success rate) as heatmaps (:func:`plot_final_table`).

  Many runs are drawn a panel per family of runs (:func:`facets`) with one legend beside the
  panels, and the per-client pictures a row per model (:func:`plot_client_boxes`); a sweep over
  several seeds is drawn as its mean per setting with a ±std band (:func:`seed_means`).

  Models that never trained (``"trained": false`` in ``summary.json``; without a summary, those
  whose accuracy never changed) are left out; models evaluated only at the end (in
  ``summary.json``, not in the metrics) are drawn as a final point.

  The CLI calls it at the end of a run; it needs matplotlib (``pip install -e ".[plot]"``).
  """
  records = seed_means(read_metrics(workdir))
  written = []
  if not records:
    return written
  summary: dict[str, Any] = {}
  summary_path = os.path.join(workdir, "summary.json")
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  untrained = untrained_models(summary)
  untrained |= {(str(r["run"]), m) for r in records if "sweep_run" in r
                for run, m in list(untrained) if run == r["sweep_run"]}
  left_out = untrained if summary else frozen_models(records)
  labels = runs(records)
  if models_of(records, "accuracy"):
    finals = {(run, m): s["accuracy"] for run, models in summary.items() if isinstance(models, Mapping)
              for m, s in models.items()
              if isinstance(s, Mapping) and isinstance(s.get("accuracy"), float)
              and (run, m) not in untrained
              and not curve(records, run, f"{m}/accuracy")[0].size}
    written.append(plot_runs(records, os.path.join(workdir, "plot_accuracy.png"),
                             skip=untrained, skip_frozen=not summary, finals=finals))
    if any(len([m for m in models_of([r for r in records if r["run"] == run], "accuracy")
                if (run, m) not in left_out]) > 1 for run in labels):
      written.append(plot_models_per_run(records, os.path.join(workdir, "plot_models.png"), skip=left_out))
  fair = fairness_keys(records)
  if fair:
    model, metric = next(((m, k) for m, k in fair if m == "global"), fair[0])
    skip_runs = {run for run, m in untrained | frozen_models(records) if m == model}
    if any(run not in skip_runs for run in labels):
      written.append(plot_fairness_over_rounds(records, os.path.join(workdir, "plot_fairness_rounds.png"),
                                               model=model, metric=metric, skip=skip_runs))
  if "global" in models_of(records, "accuracy") and any("uplink_MB" in r for r in records):
    skip_runs = {run for run, m in left_out if m == "global"}
    if any(run not in skip_runs for run in labels):
      written.append(plot_accuracy_vs_uplink(records, os.path.join(workdir, "plot_accuracy_uplink.png"),
                                             skip=skip_runs))
  if models_of(records, "perplexity"):
    written.append(plot_perplexity(records, os.path.join(workdir, "plot_perplexity.png")))
  if models_of(records, "intra_cluster_accuracy"):
    written.append(plot_clusters(records, os.path.join(workdir, "plot_clusters.png")))
  if any("sim_seconds" in r for r in records) and "global" in models_of(records, "accuracy"):
    written.append(plot_time_to_accuracy(records, os.path.join(workdir, "plot_time_accuracy.png")))
  for m in models_of(records, "false_accept_rate")[:1]:
    written.append(plot_keyword_rates(records, os.path.join(workdir, "plot_keyword_rates.png"), model=m))
  if summary:
    skip = untrained | frozen_models(records) - trained_models(summary)
    values = client_accuracies(summary, max_series=len(summary) * 64, skip=skip)
    if len(values) > 12:   # a box per run and model, not a panel each
      written.append(plot_client_boxes(values, os.path.join(workdir, "plot_client_accuracy.png"),
                                       title="final test accuracy per client (box: quartiles; "
                                             "whiskers: 10th-90th percentile)"))
    elif values:
      written.append(plot_client_histograms(values, os.path.join(workdir, "plot_client_accuracy.png"),
                                            title="final test accuracy per client (dashed: mean)"))
    if fairness_series(summary, skip=skip):
      written.append(plot_client_fairness(summary, os.path.join(workdir, "plot_client_fairness.png"),
                                          skip=skip))
    table_runs = [run for run, models in summary.items() if isinstance(models, Mapping)
                  and isinstance(models.get("global"), Mapping) and (run, "global") not in skip]
    if len(table_runs) > FACET_ABOVE and grid_of(table_runs) is not None:
      written.append(plot_final_table({r: summary[r] for r in table_runs},
                                      os.path.join(workdir, "plot_final_table.png")))
  return written


def untrained_models(summary: Mapping[str, Any]) -> set[tuple[str, str]]:
  """``(run, model)`` pairs a ``summary.json`` marks ``"trained": false`` (still the initial
  parameters at the end of the run: not a result), and those a sweep's entry lists as
  ``"untrained"`` (:func:`fedtree.experiment.sweep_driver.run_sweep`)."""
  out = {(run, m) for run, models in summary.items() if isinstance(models, Mapping)
         for m, s in models.items() if isinstance(s, Mapping) and s.get("trained") is False}
  out |= {(run, str(m)) for run, models in summary.items() if isinstance(models, Mapping)
          and isinstance(models.get("sweep"), Mapping) for m in models["sweep"].get("untrained", ())}
  return out


def trained_models(summary: Mapping[str, Any]) -> set[tuple[str, str]]:
  """``(run, model)`` pairs a ``summary.json`` marks ``"trained": true``."""
  return {(run, m) for run, models in summary.items() if isinstance(models, Mapping)
          for m, s in models.items() if isinstance(s, Mapping) and s.get("trained") is True}


def frozen_models(records: Sequence[Mapping[str, Any]], metric: str = "accuracy") -> set[tuple[str, str]]:
  """``(run, model)`` pairs whose ``metric`` never changed over several reports (e.g. the root
  of a tree whose root never aggregates: an untrained model, not a result)."""
  out = set()
  for run in runs(records):
    for m in models_of([r for r in records if r["run"] == run], metric):
      _, y = curve(records, run, f"{m}/{metric}")
      if y.size > 1 and np.all(y == y[0]):
        out.add((run, m))
  return out


def client_accuracies(summary: Mapping[str, Any], max_series: int = 8,
                      skip: Iterable[tuple[str, str]] = ()) -> dict[str, np.ndarray]:
  """``{"run · model": float[C]}`` per-client accuracies of a ``summary.json``; of a run's
  models only those whose accuracy differs from an earlier one's (e.g. not ``level1`` of a
  HierFAVG run when it equals ``global``) and that are not in ``skip`` (``(run, model)``
  pairs, e.g. :func:`frozen_models`), at most ``max_series`` in all."""
  skip = set(skip)
  out: dict[str, np.ndarray] = {}
  for run, models in summary.items():
    if not isinstance(models, Mapping):
      continue
    seen: list[np.ndarray] = []
    for name, s in models.items():
      if not isinstance(s, Mapping) or not isinstance(s.get("client_accuracy"), list):
        continue
      if (run, name) in skip:
        continue
      v = np.asarray([np.nan if a is None else a for a in s["client_accuracy"]], np.float64)
      if any(v.shape == u.shape and np.allclose(v, u, equal_nan=True) for u in seen):
        continue
      seen.append(v)
      out[f"{run} · {name}" if len(models) > 1 else run] = v
  return dict(list(out.items())[:max_series])


def _share_y(axes) -> None:
  lims = [ax.get_ylim() for ax in axes if ax.lines]
  if lims:
    lo, hi = min(a for a, _ in lims), max(b for _, b in lims)
    for ax in axes:
      ax.set_ylim(lo, hi)


def plot_sweep(records: Sequence[Mapping[str, Any]], path: str, *, run: str,
               metric: str = "global/accuracy", title: str | None = None) -> str:
  """A sweep's ``metric`` over rounds: a line per setting (the mean over seeds) and a shaded
  ±std band. ``records`` are every ``metrics.jsonl`` row of the sweep (several per round: one
  per experiment, with ``setting`` and ``seed``; read them all, not :func:`read_metrics`)."""
  plt = pyplot()
  by: dict[str, dict[int, list[float]]] = {}
  for r in records:
    if not (str(r.get("run", "")) == run or str(r.get("run", "")).startswith(run + "#chunk")):
      continue
    if r.get(metric) is None or "setting" not in r:
      continue
    name = setting_label(r["setting"])
    by.setdefault(name, {}).setdefault(int(r["round"]), []).append(float(r[metric]))
  if not by:
    raise ValueError(f"no rows of run {run!r} report {metric!r}")
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for name, pts in by.items():
    x = np.asarray(sorted(pts))
    ys = [np.asarray(pts[i]) for i in x]
    mean = np.asarray([y.mean() for y in ys])
    std = np.asarray([y.std() for y in ys])
    (line,) = ax.plot(x, mean, marker="o", ms=3, label=name)
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
  ax.set_xlabel("round")
  ax.set_ylabel(_label_metric(metric))
  ax.grid(alpha=0.3)
  seeds = max(len(v) for pts in by.values() for v in pts.values())
  _legend(ax)
  ax.set_title(title or (f"{run}: mean ± std over {seeds} seeds" if seeds > 1 else f"{run}: one seed"))
  return save(fig, path)


def plot_privacy_utility(rows: Sequence[Mapping[str, Any]], path: str, *, run: str,
                         metric: str = "global/accuracy", title: str | None = None) -> str:
  """A privacy sweep's privacy–utility curve: the final ``metric`` (mean ± std over seeds) against
  the ε each setting spent (log scale); settings without privacy (ε infinite, ``z = 0``) are a
  dashed line labelled "no DP". ``rows`` are the sweep's rows (``{name, mean, std}``, their means
  holding ``epsilon`` and ``metric``)."""
  plt = pyplot()
  pts = [(float(r["mean"]["epsilon"]), float(r["mean"][metric]), float(r["std"].get(metric, 0.0)), r["name"])
         for r in rows if "epsilon" in r["mean"] and metric in r["mean"]]
  finite = sorted(p for p in pts if math.isfinite(p[0]) and p[0] > 0)
  if not pts:
    raise ValueError(f"no row of run {run!r} has epsilon and {metric!r}")
  fig, ax = plt.subplots(figsize=(6.0, 3.8))
  if finite:
    x, y, e = (np.asarray([p[i] for p in finite]) for i in range(3))
    ax.errorbar(x, y, yerr=e, marker="o", ms=4, capsize=3, label=run)
    for eps, acc, _, name in finite:
      ax.annotate(name.replace("noise_multiplier", "z"), (eps, acc), fontsize=6,
                  textcoords="offset points", xytext=(3, 3))
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
  for _, acc, _, name in (p for p in pts if not math.isfinite(p[0])):
    ax.axhline(acc, ls="--", color="gray", label=f"no DP ({name})")
  ax.set_xlabel("ε (after the last round)")
  ax.set_ylabel(_label_metric(metric.rsplit("/", 1)[-1]))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title(title or f"{run}: privacy–utility (mean ± std over seeds)")
  return save(fig, path)
