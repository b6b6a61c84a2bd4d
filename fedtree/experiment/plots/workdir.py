"""Every picture a workdir's ``metrics.jsonl`` and ``summary.json`` allow, written into it
(:func:`write_run_plots`, which the CLI calls at the end of a run)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedtree.experiment.plots.clients import plot_client_boxes, plot_client_histograms
from fedtree.experiment.plots.clusters import plot_clusters
from fedtree.experiment.plots.curves import (
  plot_accuracy_vs_uplink,
  plot_keyword_rates,
  plot_models_per_run,
  plot_perplexity,
  plot_runs,
  plot_time_to_accuracy,
)
from fedtree.experiment.plots.fairness import plot_client_fairness, plot_fairness_over_rounds
from fedtree.experiment.plots.mobility import plot_membership
from fedtree.experiment.plots.panels import FACET_ABOVE
from fedtree.experiment.plots.records import (
  curve,
  fairness_keys,
  frozen_models,
  models_of,
  read_metrics,
  runs,
  seed_means,
)
from fedtree.experiment.plots.summary import (
  client_accuracies,
  fairness_series,
  trained_models,
  untrained_models,
)
from fedtree.experiment.plots.table import grid_of, plot_final_table


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
  * ``plot_membership_<run>.png``: every client's edge over rounds and every edge's load, for every
    ``membership_<run>.npz`` a mobility section wrote (:func:`plot_membership`);
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
  if not records:
    return []
  summary: dict[str, Any] = {}
  summary_path = os.path.join(workdir, "summary.json")
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  untrained = untrained_models(summary)
  untrained |= {(str(r["run"]), m) for r in records if "sweep_run" in r
                for run, m in list(untrained) if run == r["sweep_run"]}
  written = _round_pictures(workdir, records, summary, untrained)
  for name in sorted(os.listdir(workdir)):
    if name.startswith("membership_") and name.endswith(".npz"):
      with np.load(os.path.join(workdir, name)) as m:
        run = name[len("membership_"):-len(".npz")]
        out = os.path.join(workdir, f"plot_membership_{run}.png")
        written.append(plot_membership(m["edges"], m["up"], out, title=f"{run}: membership over rounds "
                                                                        f"(black: waiting for a down edge)"))
  if summary:
    written += _client_pictures(workdir, records, summary, untrained)
  return written


def _round_pictures(workdir: str, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any],
                    untrained: set[tuple[str, str]]) -> list[str]:
  """The pictures over rounds (or uplink, or simulated time) that ``records`` allow, models
  ``untrained`` (and, without a ``summary``, those that never changed) left out."""
  written = []
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
  return written


def _client_pictures(workdir: str, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any],
                     untrained: set[tuple[str, str]]) -> list[str]:
  """The pictures of the final per-client values and results a ``summary`` allows, models
  ``untrained`` and those that never changed (unless the summary says they trained) left out."""
  written = []
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
