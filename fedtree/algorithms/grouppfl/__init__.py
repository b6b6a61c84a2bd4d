"""Group personalized FL (paper 000): the stages, their cost counters, the reports, and the
paper's Gaussian hierarchical model."""

from fedtree.algorithms.grouppfl.costs import ClientCosts, counting
from fedtree.algorithms.grouppfl.grouppfl import (
  METHODS,
  STAGES,
  GroupPersonalizedFL,
  StageResult,
  finetune_stage,
  global_stage,
  group_cohort_sizes,
  group_fedopt,
  group_stage,
  summarize_stats,
)

__all__ = [
  "METHODS", "STAGES", "ClientCosts", "GroupPersonalizedFL", "StageResult", "counting",
  "finetune_stage", "global_stage", "group_cohort_sizes", "group_fedopt", "group_stage",
  "summarize_stats",
]
