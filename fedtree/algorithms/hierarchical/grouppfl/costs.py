"""Per-client communication and computation cost, counted by the simulation as it runs (paper 000,
Table 4): :func:`counting` wraps any client update.

What is counted and why: :doc:`costs on the GroupPerFL page <algorithms/grouppfl.md#costs>`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedtree.core.local import ClientData, ClientUpdate, steps_per_epoch
from fedtree.toolbox.traffic import ROUND_TRIP_MODELS

PyTree = Any


@struct.dataclass
class ClientCosts:
  """Running totals per client.

  Attributes:
    transfers: ``float32[C]`` models moved between the client and its server (down + up).
    epochs: ``float32[C]`` local epochs trained.
    rounds: ``int32[C]`` rounds the client took part in.
  """

  transfers: jax.Array
  epochs: jax.Array
  rounds: jax.Array

  @classmethod
  def zeros(cls, num_clients: int) -> ClientCosts:
    return cls(
      transfers=jnp.zeros((num_clients,), jnp.float32),
      epochs=jnp.zeros((num_clients,), jnp.float32),
      rounds=jnp.zeros((num_clients,), jnp.int32),
    )

  def __add__(self, other: ClientCosts) -> ClientCosts:
    return jax.tree.map(jnp.add, self, other)

  def host(self) -> dict[str, np.ndarray]:
    return {k: np.asarray(getattr(self, k)) for k in ("transfers", "epochs", "rounds")}


class CountedState(NamedTuple):
  """The client state of a :func:`counting` update.

  Attributes:
    inner: the wrapped update's own client state ``[C, ...]`` (``()`` if none).
    costs: the running :class:`ClientCosts` ``[C]``.
  """

  inner: PyTree
  costs: ClientCosts


def counting(update: ClientUpdate, *, batch_size: int, max_steps: int) -> ClientUpdate:
  """``update`` whose client state becomes a :class:`CountedState` (its own state, the costs).

  Each call adds :data:`~fedtree.toolbox.traffic.ROUND_TRIP_MODELS` (2) transfers (the model down and
  the update up), 1 round, and the epochs the
  scan ran (``min(num_steps, max_steps) / ceil(n / B)``).
  """

  def apply(anchor, state, data: ClientData, num_steps, key):
    inner, costs = state
    params, inner, loss = update.apply(anchor, inner, data, num_steps, key)
    steps = jnp.minimum(num_steps, max_steps).astype(jnp.float32)
    spe = jnp.maximum(steps_per_epoch(data.n, batch_size), 1).astype(jnp.float32)
    costs = ClientCosts(
      transfers=costs.transfers + ROUND_TRIP_MODELS, epochs=costs.epochs + steps / spe,
      rounds=costs.rounds + 1,
    )
    return params, CountedState(inner, costs), loss

  def init_state(params, num_clients):
    inner = () if update.init_state is None else update.init_state(params, num_clients)
    return CountedState(inner, ClientCosts.zeros(num_clients))

  return ClientUpdate(apply=apply, init_state=init_state)
