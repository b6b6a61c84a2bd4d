r"""Your own data from the command line: per-client ``.npz`` arrays, or a Hugging Face dataset
split by fedtree's or Flower Datasets' partitioners.

  # arrays (a published run's exact clients: padded, flat, keyed per client as x_train_0,
  # y_train_0, ..., or a folder; see fedtree.datasets.arrays for the layouts)
  python -m fedtree.main --config=configs/own_data.py --workdir=/tmp/own_arrays \
    --config.data.path=/path/clients.npz
  # a Hugging Face dataset written by save_to_disk (pip install -e ".[hf]")
  python -m fedtree.main --config=configs/own_data.py:hf --workdir=/tmp/own_hf \
    --config.data.path=/path/mnist_saved --config.data.x_columns=image
  # the same, split by Flower Datasets' DirichletPartitioner (exactly Flower's partition)
  python -m fedtree.main --config=configs/own_data.py:hf_flower --workdir=/tmp/own_flower \
    --config.data.path=/path/mnist_saved --config.data.partitioner_args.alpha=0.3

Two runs, FedAvg and HierFAVG over the groups the data name (one group when they name none;
``--config.data.team_size=N`` forms groups of N consecutive clients). The final table's
``clients`` column gives the 10th/50th/90th percentile and the Gini coefficient of per-client
accuracy; ``summary.json`` has them per model and per group, ``plot_client_fairness.png`` the
histogram. Inputs are flattened by the ``mlp`` model, so any array or image shape works;
``--config.model.name=logreg`` trains a logistic model instead (the ``mlp``'s ``hidden`` is left
out, with a line saying so).
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

VARIANTS = (None, "hf", "hf_flower")


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (``data.name="arrays"``), ``"hf"`` (a ``save_to_disk`` folder split
  by fedtree's Dirichlet partitioner) or ``"hf_flower"`` (split by Flower's)."""
  if variant not in VARIANTS:
    raise ValueError(f"configs/own_data.py:{variant}; choose one of {VARIANTS[1:]} or no variant")
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 50
  c.eval_every = 10
  c.rounds_per_call = 10
  c.progress = True
  placeholder = ml_collections.config_dict.placeholder
  if variant is None:
    c.data = ml_collections.ConfigDict(dict(
      name="arrays", path=placeholder(str), num_classes=placeholder(int), test_fraction=0.2,
      team_size=placeholder(int), seed=0,
    ))
  else:
    c.data = ml_collections.ConfigDict(dict(
      name="hf", path=placeholder(str), format="disk", split="train", test_split=placeholder(str),
      x_columns="image", label_column="label", client_column=placeholder(str),
      num_classes=placeholder(int), test_fraction=0.2, team_size=placeholder(int), seed=0,
    ))
    if variant == "hf":
      c.data.partitioner = "dirichlet"
      c.data.partitioner_args = ml_collections.ConfigDict(dict(num_clients=20, alpha=0.5))
    else:
      c.data.partitioner = "flwr.DirichletPartitioner"
      c.data.partitioner_args = ml_collections.ConfigDict(dict(
        num_partitions=20, partition_by="label", alpha=0.5, min_partition_size=10, seed=42))
      # the rows shuffled first, as flwr_datasets.FederatedDataset(shuffle=True, seed=42) hands them
      c.data.shuffle, c.data.shuffle_seed = True, 42
  c.topology = ml_collections.ConfigDict(dict(kind="groups"))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(64,)))
  c.local = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.05, batch_size=16, epochs=1,
                                           steps=None))
  c.runs = ml_collections.ConfigDict()
  c.runs.fedavg = ml_collections.ConfigDict(dict(algorithm="fedavg", cohort_size=None))
  c.runs.hierfavg = ml_collections.ConfigDict(dict(algorithm="hierfavg", cohort_size=None, periods=(5,)))
  c.run_order = ("fedavg", "hierfavg")
  c.mesh_shape = placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)
