"""Every algorithm fedtree simulates, and the builders that make them from a run config.

``BUILDERS[name](run_config, context)`` returns a
:class:`~fedtree.algorithms.base.FederatedAlgorithm` or a
:class:`~fedtree.experiment.Pipeline`. The dict is written out here, in one place, on
purpose: no registry filled by import side effects.
"""

from __future__ import annotations

from fedtree.algorithms import builders, clustered_builders, kws_builders, personalization_builders
from fedtree.algorithms.awcfl import awcfl
from fedtree.algorithms.base import FederatedAlgorithm, NodeModels, TreeState
from fedtree.algorithms.bhfl import bhfl
from fedtree.algorithms.cfl import cfl
from fedtree.algorithms.hierfavg import fedavg, hierfavg
from fedtree.algorithms.ifca import ifca
from fedtree.algorithms.mcfl import mcfl
from fedtree.algorithms.pfedmt import pfedmt

BUILDERS = {
  "fedavg": builders.build_fedavg,
  "fedopt": builders.build_fedavg,
  "hierfavg": builders.build_hierfavg,
  "fedprox": personalization_builders.build_fedprox,
  "ditto": personalization_builders.build_ditto,
  "pfedme": personalization_builders.build_pfedme,
  "perfedavg": personalization_builders.build_perfedavg,
  "grouppfl": personalization_builders.build_grouppfl,
  "pfedmt": builders.build_pfedmt,
  "bhfl": builders.build_bhfl,
  "cfl": clustered_builders.build_cfl,
  "ifca": clustered_builders.build_ifca,
  "awcfl": clustered_builders.build_awcfl,
  "mcfl": clustered_builders.build_mcfl,
  "fedkws": kws_builders.build_fedkws,
}

__all__ = [
  "BUILDERS", "FederatedAlgorithm", "NodeModels", "TreeState", "awcfl", "bhfl", "cfl", "fedavg",
  "hierfavg", "ifca", "mcfl", "pfedmt",
]
