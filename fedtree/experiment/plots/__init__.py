"""Pictures of results: metrics over rounds, per-client distributions, clusters, throughput.

Pure functions from data to a PNG file whose path the caller gives; each returns that path.
matplotlib is imported when a picture is drawn (with the non-interactive ``Agg`` backend when no
backend was chosen yet), never when this package is imported, so nothing in fedtree needs it to
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

The modules, by what they draw or read:

* :mod:`~fedtree.experiment.plots.records` and :mod:`~fedtree.experiment.plots.summary`: the
  rows of ``metrics.jsonl`` as curves, and what ``summary.json`` says of the models;
* :mod:`~fedtree.experiment.plots.figure`, :mod:`~fedtree.experiment.plots.style` and
  :mod:`~fedtree.experiment.plots.panels`: a figure's grid, axis labels and saving, the colours,
  line styles and legends, and the panels of many runs;
* :mod:`~fedtree.experiment.plots.curves`, :mod:`~fedtree.experiment.plots.clusters`,
  :mod:`~fedtree.experiment.plots.clients`, :mod:`~fedtree.experiment.plots.fairness`,
  :mod:`~fedtree.experiment.plots.table`, :mod:`~fedtree.experiment.plots.groups`,
  :mod:`~fedtree.experiment.plots.sweeps`, :mod:`~fedtree.experiment.plots.benchmarks`: the
  pictures;
* :mod:`~fedtree.experiment.plots.workdir`: every picture a workdir allows.
"""

from fedtree.experiment.plots.benchmarks import plot_benchmark_file, plot_scaling, plot_throughput
from fedtree.experiment.plots.clients import plot_client_boxes, plot_client_histograms
from fedtree.experiment.plots.clusters import plot_cluster_tradeoff, plot_clusters
from fedtree.experiment.plots.curves import (
  plot_accuracy_vs_uplink,
  plot_keyword_rates,
  plot_models_per_run,
  plot_perplexity,
  plot_runs,
  plot_time_to_accuracy,
)
from fedtree.experiment.plots.fairness import plot_client_fairness, plot_fairness_over_rounds
from fedtree.experiment.plots.figure import pyplot, save
from fedtree.experiment.plots.groups import plot_group_bars, plot_relative_change
from fedtree.experiment.plots.mobility import plot_membership
from fedtree.experiment.plots.panels import FACET_ABOVE, facets
from fedtree.experiment.plots.records import (
  Curve,
  curve,
  fairness_keys,
  frozen_models,
  models_of,
  read_metrics,
  runs,
  seed_means,
  setting_label,
  time_curve,
  time_to_target,
)
from fedtree.experiment.plots.style import LEGEND_INSIDE, LINE_STYLES, MARKERS, run_colors
from fedtree.experiment.plots.summary import (
  client_accuracies,
  fairness_series,
  trained_models,
  untrained_models,
)
from fedtree.experiment.plots.sweeps import plot_privacy_utility, plot_sweep
from fedtree.experiment.plots.table import grid_of, plot_final_table
from fedtree.experiment.plots.workdir import write_run_plots

__all__ = [
  "FACET_ABOVE", "LEGEND_INSIDE", "LINE_STYLES", "MARKERS", "Curve", "client_accuracies", "curve", "facets",
  "fairness_keys", "fairness_series", "frozen_models", "grid_of", "models_of", "plot_accuracy_vs_uplink",
  "plot_benchmark_file", "plot_client_boxes", "plot_client_fairness", "plot_client_histograms",
  "plot_cluster_tradeoff", "plot_clusters", "plot_fairness_over_rounds", "plot_final_table",
  "plot_group_bars", "plot_keyword_rates", "plot_membership", "plot_models_per_run", "plot_perplexity",
  "plot_privacy_utility",
  "plot_relative_change", "plot_runs", "plot_scaling", "plot_sweep", "plot_throughput",
  "plot_time_to_accuracy", "pyplot", "read_metrics", "run_colors", "runs", "save", "seed_means",
  "setting_label", "time_curve", "time_to_target", "trained_models", "untrained_models", "write_run_plots",
]
