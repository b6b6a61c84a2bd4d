"""Every algorithm a run config can name, and the builder that makes it from the run config.

``BUILDERS[name](run_config, context)`` returns a
:class:`~fedtree.core.algorithm.FederatedAlgorithm` (a composition such as GroupPerFL's stages is
one too, :func:`fedtree.core.algorithm.sequential`).
"""

from __future__ import annotations

from fedtree.experiment import builders, clustered_builders, kws_builders, personalization_builders

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


def build_algorithm(label: str, run_cfg, ctx):
  """The algorithm of run ``label`` (its ``config.runs.<label>``) on the shared context."""
  return BUILDERS[run_cfg.algorithm](run_cfg, ctx)


def validate_runs(config) -> None:
  """Early, named errors for every run of ``config`` (unknown or missing ``algorithm``)."""
  for label, run_cfg in config.runs.items():
    if "algorithm" not in run_cfg:
      raise ValueError(f"config.runs.{label} has no 'algorithm' field; choose one of {sorted(BUILDERS)}")
    if run_cfg.algorithm not in BUILDERS:
      raise ValueError(
        f"config.runs.{label}.algorithm={run_cfg.algorithm!r} is unknown; choose one of {sorted(BUILDERS)}"
      )
