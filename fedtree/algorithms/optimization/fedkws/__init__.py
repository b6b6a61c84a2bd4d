"""FedKWS-UI (paper 002) and its ALT schedule; its ALO objective is in :mod:`fedtree.objectives.alo`."""

from fedtree.algorithms.optimization.fedkws.alt import alt_schedule, alt_steps, client_utility, label_entropy
from fedtree.algorithms.optimization.fedkws.fedkws import fedkws

__all__ = ["alt_schedule", "alt_steps", "client_utility", "fedkws", "label_entropy"]
