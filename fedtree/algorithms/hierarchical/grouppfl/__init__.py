"""Group personalized FL (paper 000): the stages, their cost counters, the reports, and the
paper's Gaussian hierarchical model."""

from fedtree.algorithms.hierarchical.grouppfl.costs import ClientCosts, CountedState, counting
from fedtree.algorithms.hierarchical.grouppfl.grouppfl import (
  METHODS,
  STAGES,
  GroupPersonalizedFL,
  finetune_stage,
  group_cohort_sizes,
  group_fedopt,
  grouppfl,
  start_from,
  summarize_stats,
)

__all__ = [
  "METHODS", "STAGES", "ClientCosts", "CountedState", "GroupPersonalizedFL", "counting", "finetune_stage",
  "group_cohort_sizes", "group_fedopt", "grouppfl", "start_from", "summarize_stats",
]
