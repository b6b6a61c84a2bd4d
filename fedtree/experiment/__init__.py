"""The experiment layer: config -> typed runs (data, tree, model, algorithm, the capabilities'
host halves), the runner and its run loop, sweeps, checkpoints, metric writers, plots written to
the workdir, the CLI's ``train_and_evaluate``. Nothing below this layer reads a config or writes
a file.
"""

from fedtree.experiment.builders import local_optimizer_from_config, schedule_from_config
from fedtree.experiment.config_file import load_config
from fedtree.experiment.context import Context, build_topology, load_data, make_context
from fedtree.experiment.params import load_params, save_params
from fedtree.experiment.registry import BUILDERS
from fedtree.experiment.results import positive_classes_from_config
from fedtree.experiment.run import Run, resolve
from fedtree.experiment.run_loop import run_algorithm
from fedtree.experiment.runner import train_and_evaluate
from fedtree.experiment.validation import ordered_runs, validate_config

__all__ = [
  "BUILDERS", "Context", "Run", "build_topology", "load_config", "load_data", "load_params",
  "local_optimizer_from_config", "make_context", "ordered_runs", "positive_classes_from_config",
  "resolve", "run_algorithm", "save_params",
  "schedule_from_config", "train_and_evaluate", "validate_config",
]
