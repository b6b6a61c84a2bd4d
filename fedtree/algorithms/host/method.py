"""A method as a thin spec over a host: :func:`method_over` declares it, and the :class:`Host` it is
handed builds it."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import optax

from fedtree.algorithms.host.refusals import Refusal, check_refusals
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.topology import Topology

BOUND = ("client_update",)
"""The host's parameters a method fills itself (its local objective)."""


class Host(Mapping[str, Any]):
  """The arguments a method was given for its host (a read-only mapping), and the host that takes
  them: ``host.build(**fixed)`` builds the method with what it sets itself."""

  def __init__(self, factory: Callable[..., FederatedAlgorithm], arguments: Mapping[str, Any], method: str):
    self._factory, self._arguments, self._method = factory, dict(arguments), method

  def __getitem__(self, key: str) -> Any:
    return self._arguments[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._arguments)

  def __len__(self) -> int:
    return len(self._arguments)

  def replace(self, **arguments) -> Host:
    """The same host with ``arguments`` set (a method's defaults for the host's own arguments)."""
    return Host(self._factory, {**self._arguments, **arguments}, self._method)

  def stepping(self, learning_rate: float) -> Host:
    """The host whose clients' parents step ``sgd(learning_rate)`` (a method's global step size
    ``η_g``) and every level above them ``sgd(1)``, unless the caller gave ``server_optimizers``."""
    if self.get("server_optimizers") is not None:
      return self
    topology = self.get("topology")
    depth = 1 if topology is None else topology.depth
    return self.replace(server_optimizers=(optax.sgd(1.0),) * (depth - 1) + (optax.sgd(learning_rate),))

  def build(self, **fixed) -> FederatedAlgorithm:
    """The host on the given arguments and the method's ``fixed`` ones (its objective, its rule,
    its name, ...); ``topology=None`` or absent is one server over all clients.

    Raises:
      ValueError: a host argument the caller gave that the method sets itself (its server rule, its
        objective, its personal parameters, ...), which would otherwise be dropped without a word.
    """
    name = fixed.get("name", self._method)
    for key in sorted(k for k in fixed if self.get(k) is not None and self[k] is not fixed[k]):
      given = self[key]
      shown = repr(getattr(given, "name", given)) if key == "server_rule" else type(given).__name__
      raise ValueError(f"{name}: {key}={shown}; {name} keeps its own {key.replace('_', ' ')}: "
                       f"leave {key}= out")
    kw = {**self._arguments, **fixed}
    if "topology" in inspect.signature(self._factory).parameters and kw.get("topology") is None:
      kw["topology"] = Topology.flat(kw["data"].num_clients)
    return self._factory(**kw)


def method_over(host: Callable[..., FederatedAlgorithm], *, cannot: Sequence[Refusal] = (),
                sets: Mapping[str, str] | None = None, drops: Sequence[str] = (),
                bound: Sequence[str] = BOUND) -> Callable:
  """Declares ``method(host, *, <its own parameters>)`` a thin spec over the factory ``host``.

  The method takes its own hyperparameters; every other argument goes to the host, so every option of
  the host works with it, and the method builds itself with ``host.build(**what_it_sets)``. Its
  public signature, which the registry reads as a run's schema and ``help()`` shows, is its own
  keyword-only parameters followed by every parameter of the host it neither declares, binds
  (``bound``) nor drops (``drops``), with ``topology`` optional (``None``: one server over all
  clients). What it cannot compose with is declared, not written: ``cannot`` (:func:`~fedtree.
  algorithms.host.refusals.cannot`), checked before the method's body runs.

  Args:
    host: the host factory (:func:`~fedtree.algorithms.host.hierfavg.hierfavg`,
      :func:`~fedtree.algorithms.asynchronous.fedbuff.fedbuff`, ...).
    cannot: the compositions the method refuses, each with its reason.
    sets: host parameters the method sets itself, each with where the method takes it instead (a
      caller's value is refused: ``{"personal": "the head is personal: choose it with head="}``).
    drops: host parameters the method does not expose.
    bound: host parameters the method fills itself.

  Returns:
    A decorator of ``body(host: Host, *, <own parameters>) -> FederatedAlgorithm``.
  """
  refusals = tuple(cannot)
  sets = dict(sets or {})

  def wrap(body: Callable) -> Callable:
    own = {n: p for n, p in inspect.signature(body).parameters.items()
           if p.kind is inspect.Parameter.KEYWORD_ONLY}
    host_params = inspect.signature(host).parameters
    skip = set(own) | set(bound) | set(drops) | set(sets)
    params = list(own.values())
    for n, p in host_params.items():
      if n not in skip:
        params.append(p.replace(default=None) if n == "topology" else p)
    hints = {n: h for n, h in typing.get_type_hints(host).items() if n in host_params and n not in skip}
    hints.update({n: h for n, h in typing.get_type_hints(body).items() if n in own or n == "return"})
    if "topology" in hints:
      hints["topology"] = hints["topology"] | None
    default_name = own["name"].default if "name" in own else body.__name__

    @functools.wraps(body)
    def method(**kwargs) -> FederatedAlgorithm:
      mine = {k: v for k, v in kwargs.items() if k in own}
      given = {k: v for k, v in kwargs.items() if k not in own}
      name = mine.get("name", default_name)
      for key in sorted(k for k in sets if given.get(k) is not None):
        raise ValueError(f"{name}: {key}= is not an option of this method ({sets[key]})")
      check_refusals(name, refusals, given)
      return body(Host(host, given, name), **mine)

    required = [p for p in params if p.default is inspect.Parameter.empty]
    optional = [p for p in params if p.default is not inspect.Parameter.empty]
    method.__signature__ = inspect.Signature(required + optional,   # type: ignore[attr-defined]
                                             return_annotation=FederatedAlgorithm)
    method.__annotations__ = hints
    del method.__wrapped__   # the signature is the method's own and its host's, not the body's
    method.host_parameters = tuple(n for n in host_params if n not in skip)   # type: ignore[attr-defined]
    method.host = host   # type: ignore[attr-defined]
    method.cannot = refusals   # type: ignore[attr-defined]
    method.sets = sets   # type: ignore[attr-defined]
    return method

  return wrap
