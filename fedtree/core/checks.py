"""Validation helpers shared by every factory: a bad hyperparameter is named with its value."""

from __future__ import annotations

import contextlib

import jax


def is_traced(value) -> bool:
  """Whether ``value`` is a JAX tracer (a hyperparameter swept inside ``jax.vmap``/``jit``):
  the checks below skip it, its concrete values having been checked before tracing."""
  return isinstance(value, jax.core.Tracer)


def check_nonnegative(**values) -> None:
  """``ValueError`` naming the first negative (or non-finite) hyperparameter."""
  for name, v in values.items():
    if is_traced(v):
      continue
    if not (float(v) >= 0 and float(v) < float("inf")):
      raise ValueError(f"{name}={v} must be a finite number >= 0")


def check_positive(**values) -> None:
  """``ValueError`` naming the first hyperparameter that is not > 0."""
  for name, v in values.items():
    if is_traced(v):
      continue
    if not (float(v) > 0 and float(v) < float("inf")):
      raise ValueError(f"{name}={v} must be a finite number > 0")


def check_unit_interval(**values) -> None:
  """``ValueError`` naming the first hyperparameter outside ``[0, 1]`` (a weight, a probability)."""
  for name, v in values.items():
    if not is_traced(v) and not 0.0 <= float(v) <= 1.0:
      raise ValueError(f"{name}={v} must be in [0, 1]")


@contextlib.contextmanager
def named(name: str):
  """A ``ValueError`` raised inside is raised again prefixed with ``name`` (the algorithm or run
  it concerns): ``with named("moon"): check_positive(temperature=t)`` says ``moon: temperature=...``."""
  try:
    yield
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from e
