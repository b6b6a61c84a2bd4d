"""Validation helpers shared by every factory: a bad hyperparameter is named with its value."""

from __future__ import annotations


def check_nonnegative(**values) -> None:
  """``ValueError`` naming the first negative (or non-finite) hyperparameter."""
  for name, v in values.items():
    if not (float(v) >= 0 and float(v) < float("inf")):
      raise ValueError(f"{name}={v} must be a finite number >= 0")


def check_positive(**values) -> None:
  """``ValueError`` naming the first hyperparameter that is not > 0."""
  for name, v in values.items():
    if not (float(v) > 0 and float(v) < float("inf")):
      raise ValueError(f"{name}={v} must be a finite number > 0")
