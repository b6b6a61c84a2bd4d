"""The sections of a run's capabilities, converted once on the run's context: the factory
arguments they fill (:func:`capability_arguments`) and the model a capability makes the run train
(:func:`wrapping`)."""

from __future__ import annotations

from typing import Any

import ml_collections

from fedtree.experiment import capabilities as caps
from fedtree.experiment.capability import Wrapping, compose
from fedtree.experiment.registry.finetune import FINETUNE_FIELDS
from fedtree.experiment.registry.runs import resolved_context


def _named(e: ValueError, where: str, name: str) -> ValueError:
  """A capability's refusal named by its run and section (unless it names its field already)."""
  msg = str(e)
  if msg.startswith("config."):
    return e
  if not msg.startswith((f"{name}:", f"{name}.")):
    msg = f"{name}: {msg}"
  return ValueError(f"{where}: {msg}")


def capability_arguments(label: str, run, ctx) -> dict[str, Any]:
  """The factory arguments the capabilities of run ``label`` fill, each section converted once on
  the run's context (``ctx``, resolved here when it is not the run's:
  :func:`~fedtree.experiment.registry.runs.resolved_context`): ``update_paths`` (every capability's
  update-path parts, composed per level in the order of its config's capabilities,
  :data:`~fedtree.experiment.capabilities.CAPABILITIES` last) and each capability's ``argument``
  (``systems``)."""
  rctx = resolved_context(label, run, ctx)
  present = caps.sections(run, rctx.capabilities)
  if not present:
    return {}
  where = f"config.runs.{label} (algorithm={run.algorithm!r})"
  parts, out = {}, {}
  for cap, section in present:
    try:
      if cap.parts is not None:
        parts[cap.name] = cap.parts(section, rctx)
      if cap.value is not None:
        out[cap.argument] = cap.value(section, rctx)
    except ValueError as e:
      raise _named(e, where, cap.name) from e
  if parts:
    try:
      out["update_paths"] = compose(parts, list(rctx.capabilities))
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from e
  return out


def wrapping(label: str, run_cfg, ctx) -> tuple[Any, Wrapping] | None:
  """``(the run without the section, its Wrapping)`` of the capability that changes the model run
  ``label`` trains (LoRA's ``adapters``), or ``None``: the inner run (without its ``init_params``,
  which the capability reads: a base, not the inner model's start) is built on the model the
  :class:`~fedtree.experiment.capability.Wrapping` gives; ``ctx``: the run's context (resolved here
  when it is not the run's: :func:`~fedtree.experiment.registry.runs.resolved_context`)."""
  rctx = resolved_context(label, run_cfg, ctx)
  wraps = [(c, s) for c, s in caps.sections(run_cfg, rctx.capabilities) if c.wrap is not None]
  if not wraps:
    return None
  if len(wraps) > 1:
    raise ValueError(f"config.runs.{label}: sections {[c.name for c, _ in wraps]} each change the model the "
                     f"run trains; give one of them")
  cap, section = wraps[0]
  if any(n in run_cfg for n in FINETUNE_FIELDS):
    raise ValueError(f"config.runs.{label}: fine-tuning before evaluation (finetune_*) does not run on "
                     f"{cap.name}; drop one of them")
  try:
    wrap = cap.wrap(section, rctx)
  except ValueError as e:
    raise _named(e, f"config.runs.{label} (algorithm={run_cfg.algorithm!r})", cap.name) from e
  inner_run = ml_collections.ConfigDict(
    {k: v for k, v in run_cfg.items() if k not in (cap.name, "init_params")})
  return inner_run, wrap
