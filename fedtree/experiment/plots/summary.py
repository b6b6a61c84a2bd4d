"""What a run's ``<workdir>/summary.json`` says of its models: which trained, and the final
values of their clients."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np


def untrained_models(summary: Mapping[str, Any]) -> set[tuple[str, str]]:
  """``(run, model)`` pairs a ``summary.json`` marks ``"trained": false`` (still the initial
  parameters at the end of the run: not a result), and those a sweep's entry lists as
  ``"untrained"`` (:func:`fedtree.experiment.sweep_driver.run_sweep`)."""
  out = {(run, m) for run, models in summary.items() if isinstance(models, Mapping)
         for m, s in models.items() if isinstance(s, Mapping) and s.get("trained") is False}
  out |= {(run, str(m)) for run, models in summary.items() if isinstance(models, Mapping)
          and isinstance(models.get("sweep"), Mapping) for m in models["sweep"].get("untrained", ())}
  return out


def trained_models(summary: Mapping[str, Any]) -> set[tuple[str, str]]:
  """``(run, model)`` pairs a ``summary.json`` marks ``"trained": true``."""
  return {(run, m) for run, models in summary.items() if isinstance(models, Mapping)
          for m, s in models.items() if isinstance(s, Mapping) and s.get("trained") is True}


def client_accuracies(summary: Mapping[str, Any], max_series: int = 8,
                      skip: Iterable[tuple[str, str]] = ()) -> dict[str, np.ndarray]:
  """``{"run · model": float[C]}`` per-client accuracies of a ``summary.json``; of a run's
  models only those whose accuracy differs from an earlier one's (e.g. not ``level1`` of a
  HierFAVG run when it equals ``global``) and that are not in ``skip`` (``(run, model)``
  pairs, e.g. :func:`frozen_models`), at most ``max_series`` in all."""
  series = _distinct_series(summary, lambda s: s.get("client_accuracy"), skip)
  return {label: v for label, (v, _) in list(series.items())[:max_series]}


def fairness_series(summary: Mapping[str, Any], max_series: int = 6,
                    skip: Iterable[tuple[str, str]] = ()) -> dict[str, tuple[np.ndarray, Mapping[str, Any]]]:
  """``{"run · model": (per-client values float[C], fairness dict)}`` of a ``summary.json``:
  every model with a ``fairness`` entry (:func:`fedtree.core.metrics.client_distribution`) and
  its per-client accuracy (``client_perplexity`` when the fairness metric is perplexity), not
  in ``skip`` and not equal to an earlier model's of the same run, at most ``max_series``."""

  def values(s: Mapping[str, Any]):
    fair = s.get("fairness")
    return s.get(f"client_{fair.get('metric', 'accuracy')}") if isinstance(fair, Mapping) else None

  series = _distinct_series(summary, values, skip)
  return {label: (v, s["fairness"]) for label, (v, s) in list(series.items())[:max_series]}


def _distinct_series(summary: Mapping[str, Any], values: Callable[[Mapping[str, Any]], Any],
                     skip: Iterable[tuple[str, str]]) -> dict[str, tuple[np.ndarray, Mapping[str, Any]]]:
  """``{"run · model" (the run's label alone for a run of one model): (float[C], its summary)}`` of
  every model of ``summary`` whose ``values(its summary)`` is a list (``None`` entries: NaN), not in
  ``skip`` and whose values differ from an earlier model's of the same run."""
  skip = set(skip)
  out: dict[str, tuple[np.ndarray, Mapping[str, Any]]] = {}
  for run, models in summary.items():
    if not isinstance(models, Mapping):
      continue
    seen: list[np.ndarray] = []
    for name, s in models.items():
      raw = values(s) if isinstance(s, Mapping) and (run, name) not in skip else None
      if not isinstance(raw, list):
        continue
      v = np.asarray([np.nan if a is None else a for a in raw], np.float64)
      if any(v.shape == u.shape and np.allclose(v, u, equal_nan=True) for u in seen):
        continue
      seen.append(v)
      out[f"{run} · {name}" if len(models) > 1 else str(run)] = (v, s)
  return out
