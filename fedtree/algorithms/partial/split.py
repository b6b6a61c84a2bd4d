"""Partial personalization's shared part: which parameters are the head, checked once against the
model, and the parameter counts every method of the family reports (:func:`split_model`).

What the head is, and what PFLlib, FL-bench and FLGo call it: :doc:`the partial-personalization
page <algorithms/partial.md#the-head>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from fedtree.core.algorithm import FederatedAlgorithm, Report
from fedtree.core.model import Model, layer_order, param_paths
from fedtree.core.personal import Personal, Shares, parameter_counts, personal, personal_mask

PyTree = Any
Head = int | str | tuple[str, ...]
"""How a method names its head: the last ``k`` layers, or path patterns."""


def layer_pattern(model: Model, layer: str) -> str:
  """The path pattern of every parameter of top-level layer ``layer`` (and of its statistics,
  for a model with state): anchored, so ``Dense_1`` does not match ``Dense_10``."""
  roots = ("params", *model.state) if model.state else ()
  prefix = f"({'|'.join(roots)})/" if roots else ""
  return f"^{prefix}{re.escape(layer)}/"


def head_patterns(model: Model, head: Head, *, algorithm: str, what: str = "head") -> tuple[str, ...]:
  """The path patterns of ``head`` (:doc:`docs <algorithms/partial.md#the-head>`) on ``model``.

  Raises:
    ValueError: a count outside ``1 .. layers - 1`` (some layers must be left as the body), a
      pattern that is not a regular expression, or no pattern; the message names ``algorithm``.
  """
  if isinstance(head, bool):
    raise ValueError(f"{algorithm}: {what}={head!r}; give the number of last layers (an int) or path "
                     f"patterns")
  if isinstance(head, (int, np.integer)):
    layers = layer_order(model)
    k = int(head)
    if not 1 <= k < len(layers):
      raise ValueError(f"{algorithm}: {what}={k}: the model's layers are {list(layers)}; the {what} is the "
                       f"last 1..{len(layers) - 1} of them (at least one is left for the rest of the model)")
    return tuple(layer_pattern(model, name) for name in layers[-k:])
  try:
    return personal(head).patterns
  except ValueError as e:
    raise ValueError(f"{algorithm}: {what}: {e}") from e


def template_of(host: Mapping[str, Any]) -> PyTree:
  """One model of the host's (abstract): its ``init_params`` when given, else ``model.init``'s shapes."""
  if host.get("init_params") is not None:
    return host["init_params"]
  return jax.eval_shape(host["model"].init, jax.random.key(0))


def mask_of(patterns: Sequence[str], template: PyTree, *, algorithm: str) -> PyTree:
  """The leaves of ``template`` that any of ``patterns`` matches (a pytree of bools).

  Raises:
    ValueError: a pattern that matches no parameter (the message names ``algorithm`` and lists
      the parameters).
  """
  levels = Shares.of(Personal(tuple(patterns)), template, 1, algorithm).levels
  return personal_mask(levels, 0)


def exact_patterns(template: PyTree, mask: PyTree) -> tuple[str, ...]:
  """One anchored pattern per leaf of ``template`` where ``mask`` holds (a set of parameters given as
  patterns, e.g. LG-FedAvg's body: every parameter outside the head)."""
  return tuple(f"^{re.escape(p)}$"
               for p, m in zip(param_paths(template), jax.tree.leaves(mask), strict=True) if m)


def check_split(algorithm: str, template: PyTree, mask: PyTree, *, kept: str, shared: str) -> None:
  """Refuses a split that leaves one side empty: ``mask`` (the ``kept`` parameters) covering every
  parameter (nothing ``shared``: that is local training, ``algorithm='local'``) or none."""
  flags = [bool(m) for m in jax.tree.leaves(mask)]
  paths = param_paths(template)
  if all(flags):
    raise ValueError(f"{algorithm}: the {kept} covers every parameter of the model ({paths}), leaving no "
                     f"{shared} to share: that is local training (algorithm 'local'); name fewer parameters")
  if not any(flags):
    raise ValueError(f"{algorithm}: the {kept} is empty (the {shared} covers every parameter of the model, "
                     f"{paths}): nothing would stay with a client, which is FedAvg; name fewer parameters")


def counts(template: PyTree, mask: PyTree) -> dict[str, int]:
  """``{"personal": ..., "shared": ...}`` parameters of one model
  (:func:`fedtree.core.personal.parameter_counts`)."""
  p, s = parameter_counts(template, mask)
  return {"personal": p, "shared": s}


def with_parameter_counts(algorithm: FederatedAlgorithm, numbers: Mapping[str, int],
                          where: str = "") -> FederatedAlgorithm:
  """``algorithm`` whose report adds ``parameters`` (``numbers``) to every model's summary and a
  line of text (``where`` says where the personal ones are kept: per client, per subtree)."""
  inner = algorithm.report
  numbers = dict(numbers)

  def report(state, data, key, summaries):
    rep = inner(state, data, key, summaries) if inner is not None else Report(summaries)
    out = {name: {**s, "parameters": dict(numbers)} for name, s in rep.summaries.items()}
    line = f"{algorithm.name}: parameters of one model: " + ", ".join(
      f"{v:,} {k}" for k, v in numbers.items()) + (f" ({where})" if where else "")
    return Report(out, "\n".join(t for t in (rep.text, line) if t), rep.files)

  return algorithm._replace(report=report)


def where_personal(level: int | None) -> str:
  """Where a method's personal parameters live, for its report line."""
  return "personal: per client" if level is None else f"personal: shared within each level-{level} subtree"


class Split(NamedTuple):
  """A model split into the part kept with each client (or subtree) and the shared rest: the one
  sequence every method of the family runs (:func:`split_model`)."""

  patterns: tuple[str, ...]   # the kept part's path patterns (:func:`fedtree.core.personal.personal`)
  template: PyTree            # one model of the host's (abstract)
  mask: PyTree                # bools shaped as the model: True at the kept leaves

  def personal(self, level: int | None) -> Personal:
    """The host's ``personal=`` for the kept part, per client (``None``) or per level-``level`` subtree."""
    return personal(self.patterns, level=level)

  def counted(self, algorithm: FederatedAlgorithm, level: int | None) -> FederatedAlgorithm:
    """``algorithm`` reporting how many parameters are kept and shared (:func:`with_parameter_counts`)."""
    return with_parameter_counts(algorithm, counts(self.template, self.mask), where_personal(level))


def split_model(host: Mapping[str, Any], patterns: Sequence[str], *, algorithm: str, kept: str, shared: str,
                complement: bool = False) -> Split:
  """The host's model split by ``patterns`` (the kept part; with ``complement``, every parameter they
  do not match), checked: no pattern that matches nothing, neither side empty.

  Raises:
    ValueError: a pattern that matches no parameter, or a split with an empty side, naming ``algorithm``.
  """
  template = template_of(host)
  mask = mask_of(patterns, template, algorithm=algorithm)
  if complement:
    mask = jax.tree.map(lambda m: not m, mask)
    patterns = exact_patterns(template, mask)
  check_split(algorithm, template, mask, kept=kept, shared=shared)
  return Split(tuple(patterns), template, mask)
