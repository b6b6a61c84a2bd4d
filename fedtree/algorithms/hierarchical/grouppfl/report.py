"""Reports of group personalized FL in the form of paper 000's tables and figure, written by
:func:`write_reports`.

Each table and figure: :doc:`reports on the GroupPerFL page <algorithms/grouppfl.md#reports>`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedtree.toolbox.traffic import MB

METRICS = ("accuracy", "perplexity", "sentence_perplexity")


def _fmt(v: float, metric: str) -> str:
  if not np.isfinite(v):
    return "nan"
  return f"{100 * v:.2f}" if metric == "accuracy" else f"{v:.3f}"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)


def data_table(n_train: np.ndarray, n_test: np.ndarray, groups: np.ndarray,
               group_names: Sequence[str]) -> str:
  """Markdown table of clients, training and test examples per group, and the median number
  of training examples per client (the paper's point: most clients have few)."""
  groups = np.asarray(groups)
  n_train, n_test = np.asarray(n_train), np.asarray(n_test)
  rows = []
  for scope, mask in [(n, groups == g) for g, n in enumerate(group_names)] + [
    ("all", np.ones_like(groups, bool))
  ]:
    rows.append([scope, str(int(mask.sum())), str(int(n_train[mask].sum())),
                 str(int(n_test[mask].sum())), f"{np.median(n_train[mask]):g}"])
  return "data per group\n\n" + _markdown(
    ["group", "#clients", "#train examples", "#test examples", "median train/client"], rows
  )


def group_table(results: dict[str, dict[str, Any]], groups: np.ndarray,
                group_names: Sequence[str], metric: str = "accuracy") -> str:
  """Markdown table: rows = groups (with their number of clients) and ``all``; columns =
  methods; cells = ``metric`` (accuracy in %, or perplexity) on each group's test data."""
  if metric not in METRICS:
    raise ValueError(f"metric={metric!r}; choose one of {METRICS}")
  methods = list(results)
  sizes = np.bincount(np.asarray(groups), minlength=len(group_names))
  key = f"group_{metric}"
  rows = []
  for g, name in enumerate(group_names):
    rows.append([name, str(int(sizes[g]))] + [_fmt(results[m][key][g], metric) for m in methods])
  rows.append(["all", str(int(sizes.sum()))] + [_fmt(results[m][metric], metric) for m in methods])
  unit = " (%)" if metric == "accuracy" else ""
  return f"{metric}{unit} per group\n\n" + _markdown(["group", "#clients"] + methods, rows)


def relative_change(before: np.ndarray, after: np.ndarray) -> np.ndarray:
  """``(after - before) / before`` per client; NaN where ``before`` is 0 or NaN."""
  before = np.asarray(before, np.float64)
  after = np.asarray(after, np.float64)
  ok = np.isfinite(before) & np.isfinite(after) & (before != 0)
  return np.where(ok, (after - np.where(ok, before, 1.0)) / np.where(ok, before, 1.0), np.nan)


def best_groups(models: dict[str, dict[str, Any]], model: str) -> float:
  """The groups where ``model`` has the highest accuracy of a run's ``models`` (``{model: summary}``;
  a figure of the configs' tables, :mod:`benchmarks.config_figures`)."""
  acc = np.asarray([models[m]["group_accuracy"] for m in models], np.float64)
  return float(np.sum(acc[list(models).index(model)] >= acc.max(axis=0)))


def lower_perplexity_than_perfl(models: dict[str, dict[str, Any]], model: str) -> float:
  """The share of clients whose perplexity is lower with ``model`` than with PerFL (over the clients
  with both; NaN for PerFL itself or a run without it): Fig. 1's count, a figure of the configs'
  tables."""
  if model == "PerFL" or "PerFL" not in models:
    return float("nan")
  base = np.asarray(models["PerFL"]["client_perplexity"], np.float64)
  new = np.asarray(models[model]["client_perplexity"], np.float64)
  ok = np.isfinite(base) & np.isfinite(new)
  return float(np.mean(new[ok] < base[ok]))


def perplexity_figures(groups: Sequence[str], tolerance: float = 1.0) -> tuple[tuple, ...]:
  """A config's ``FIGURES`` (:mod:`benchmarks.config_figures`) for a language model's table: the
  perplexity of every group (headed by ``groups``, in the data's order) and of all clients, to one
  decimal within ``tolerance``, and :func:`lower_perplexity_than_perfl` in percent."""
  return (*((name, f"group_perplexity.{g}", 1, 1, tolerance) for g, name in enumerate(groups)),
          ("all", "perplexity", 1, 1, tolerance), ("ppl<PerFL%", lower_perplexity_than_perfl, 100, 1, 2.0))


def save_histogram(
  path, values: np.ndarray, *, title: str, xlabel: str, bins: int = 30
) -> None:
  """A histogram of the finite ``values`` with a line at 0, saved as a PNG at ``path`` (a
  file name or a binary file object)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.hist(100 * v, bins=bins, color="tab:blue", edgecolor="white")
  ax.axvline(0.0, color="black", lw=1)
  ax.set_xlabel(xlabel)
  ax.set_ylabel("number of clients")
  ax.set_title(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120, format="png")
  plt.close(fig)


def cost_table(results: dict[str, dict[str, Any]], groups: np.ndarray,
               group_names: Sequence[str]) -> str:
  """Markdown table of the mean per-client communication (model transfers) and computation
  (local epochs) of every method, over all clients and over each group."""
  methods = [m for m in results if "client_costs" in results[m]]
  groups = np.asarray(groups)
  rows = []
  for scope, mask in [("all", np.ones_like(groups, bool))] + [
    (n, groups == g) for g, n in enumerate(group_names)
  ]:
    for what, field in (("communication (models)", "transfers"),
                        ("computation (epochs)", "epochs")):
      vals = [float(np.mean(np.asarray(results[m]["client_costs"][field])[mask])) for m in methods]
      rows.append([scope, what] + [f"{v:.2f}" for v in vals])
    if all("model_bytes" in results[m] for m in methods):   # the same transfers in megabytes
      vals = [float(np.mean(np.asarray(results[m]["client_costs"]["transfers"])[mask]))
              * results[m]["model_bytes"] / MB for m in methods]
      rows.append([scope, "communication (MB)"] + [f"{v:.4g}" for v in vals])
  return ("mean cost per client (communication in model sizes, computation in local epochs)\n\n"
          + _markdown(["clients", "cost"] + methods, rows))


def render_reports(results: dict[str, dict[str, Any]], *, groups: np.ndarray,
                   group_names: Sequence[str], histogram_metric: str = "perplexity",
                   histogram_group: int | None = None, prefix: str = "grouppfl",
                   data_counts: tuple[np.ndarray, np.ndarray] | None = None
                   ) -> tuple[str, dict[str, str | bytes]]:
  """Tables (data, accuracy, perplexity, costs) and, when PerFL and GroupPerFL both ran, the
  Fig. 1 histogram over the clients of ``histogram_group`` (``None``: all clients; the paper
  shows its largest group; without matplotlib a line in the text says so). Pure: returns
  ``(text, {file name: content})`` with ``<prefix>_report.md`` and ``<prefix>_fig1.png``.
  ``data_counts`` is ``(n_train [C], n_test [C])``."""
  import io

  files: dict[str, str | bytes] = {}
  parts = [] if data_counts is None else [data_table(*data_counts, groups, group_names)]
  parts += [group_table(results, groups, group_names, "accuracy"),
            group_table(results, groups, group_names, "perplexity")]
  if all("group_sentence_perplexity" in r for r in results.values()):  # a language model's sentences
    parts.append(group_table(results, groups, group_names, "sentence_perplexity"))
  rates = {m: r["rate"] for m, r in results.items() if "rate" in r}
  if rates:
    parts.append("fine-tune rate selected: " + ", ".join(f"{m}: {r:g}" for m, r in rates.items()))
  parts.append(cost_table(results, groups, group_names))
  if "PerFL" in results and "GroupPerFL" in results:
    key = "client_perplexity" if histogram_metric == "perplexity" else "client_accuracy"
    change = relative_change(results["PerFL"][key], results["GroupPerFL"][key])
    scope = "all clients"
    if histogram_group is not None:
      change = change[np.asarray(groups) == int(histogram_group)]
      scope = f"clients of group {group_names[int(histogram_group)]}"
    finite = change[np.isfinite(change)]
    better = (finite < 0) if histogram_metric == "perplexity" else (finite > 0)
    share = 100 * better.mean() if finite.size else float("nan")
    median = 100 * np.median(finite) if finite.size else float("nan")
    parts.append(
      f"GroupPerFL vs PerFL, {scope}: {share:.1f}% of {finite.size} clients improve "
      f"{histogram_metric}; median relative change {median:+.2f}%"
    )
    png = io.BytesIO()
    try:
      save_histogram(png, change, title=f"GroupPerFL vs PerFL: relative {histogram_metric} change ({scope})",
                     xlabel=f"relative {histogram_metric} change (%)")
      files[f"{prefix}_fig1.png"] = png.getvalue()
    except ImportError:   # an optional plotting library: the tables are the results
      parts.append(f"note: matplotlib is not installed, so no {prefix}_fig1.png "
                   '(pip install -e ".[plot]")')
  text = "\n\n".join(parts)
  files[f"{prefix}_report.md"] = text + "\n"
  return text, files


def write_reports(workdir: str | None, results: dict[str, dict[str, Any]], **kwargs) -> str:
  """:func:`render_reports`, its files written into ``workdir`` (nothing without one);
  returns the text."""
  text, files = render_reports(results, **kwargs)
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    for name, content in files.items():
      with open(os.path.join(workdir, name), "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)
  return text
