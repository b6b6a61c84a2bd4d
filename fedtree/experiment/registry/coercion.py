"""A run field's value as the type its factory parameter is annotated with: which annotations a
config value can take (:func:`is_scalar`), and the value coerced to one (:func:`coerce`)."""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from typing import Any

import jax
import numpy as np

SCALARS = (int, float, bool, str)


def union_args(hint) -> tuple:
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    return typing.get_args(hint)
  return (hint,)


def _sequence_arg(args):
  for a in args:
    if typing.get_origin(a) in (tuple, list, collections.abc.Sequence):
      inner = [x for x in typing.get_args(a) if x is not Ellipsis]
      return inner[0] if inner else Any
  return None


def is_scalar(hint) -> bool:
  """A hint a config value can be coerced to: scalars, ``None``, tuples of scalars."""
  args = [a for a in union_args(hint) if a is not type(None)]
  if not args:
    return False
  for a in args:
    if a in SCALARS:
      continue
    inner = _sequence_arg([a])
    if inner is None or not is_scalar(inner):
      return False
  return True


def coerce(value, hint, where: str):
  """``value`` (from an ml_collections config) as the annotated type ``hint``.

  A ``jax.Array`` (a swept hyperparameter, possibly a tracer inside ``jax.vmap``) passes
  through unchanged: its concrete values are checked before tracing.
  """
  if isinstance(value, jax.Array):
    return value
  args = union_args(hint)
  if value is None:
    if type(None) in args:
      return None
    raise ValueError(f"{where}=None; it must be a {type_name(hint)}")
  if isinstance(value, (list, tuple)):
    inner = _sequence_arg(args)
    if inner is None:
      raise ValueError(f"{where}={value!r}; it must be a {type_name(hint)}, not a sequence")
    return tuple(coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
  if bool in args and isinstance(value, (bool, np.bool_)):
    return bool(value)
  is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  if int in args and is_number and (float not in args or isinstance(value, (int, np.integer))):
    if float(value) != int(value):
      raise ValueError(f"{where}={value!r}; it must be an integer")
    return int(value)
  if float in args and is_number:
    return float(value)
  if str in args and isinstance(value, str):
    return value
  if any(a is Any for a in args):
    return value
  raise ValueError(f"{where}={value!r}; it must be a {type_name(hint)}")


def type_name(hint) -> str:
  return str(hint).replace("typing.", "").replace("collections.abc.", "")


def type_hints(factory) -> dict[str, Any]:
  target = factory.__init__ if inspect.isclass(factory) else factory
  try:
    return typing.get_type_hints(target)
  except Exception:  # an annotation that does not resolve: treat every parameter as untyped
    return {}
