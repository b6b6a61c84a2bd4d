"""fedtree: hierarchical, clustered and personalized federated learning, simulated in JAX.

Every client of a tier is a slice of one stacked parameter pytree; a whole tier trains in one
jitted ``vmap``; aggregation is ``segment_sum`` over parent indices; every server node keeps
its own optax optimizer state. See README.md for a tour.
"""

from fedtree import algorithms, datasets, simulation
from fedtree.algorithms import BUILDERS, FederatedAlgorithm, NodeModels, TreeState, fedavg, hierfavg
from fedtree.data import FederatedData, as_device, from_client_arrays
from fedtree.evaluation import EvalStats, evaluate, summarize
from fedtree.local import ClientUpdate, LocalSchedule, proximal, sgd_client_update
from fedtree.models import Model, build_model
from fedtree.sampling import Cohort, cohort_sampler
from fedtree.server import fedopt, server_optimizer
from fedtree.tier import TierResult, train_cohort
from fedtree.topology import Topology

__version__ = "0.1.0"

__all__ = [
  "BUILDERS", "ClientUpdate", "Cohort", "EvalStats", "FederatedAlgorithm", "FederatedData",
  "LocalSchedule", "Model", "NodeModels", "TierResult", "Topology", "TreeState", "algorithms",
  "as_device", "build_model", "cohort_sampler", "datasets", "evaluate", "fedavg", "fedopt",
  "from_client_arrays", "hierfavg", "proximal", "server_optimizer", "sgd_client_update",
  "simulation", "summarize", "train_cohort",
]
