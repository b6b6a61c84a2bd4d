"""The algorithm interface every method implements, and the tree state they share (engine core:
importing this module imports no algorithm).

An algorithm is a :class:`FederatedAlgorithm`: pure ``init(key) -> state`` and
``round(state, data, key) -> (state, metrics)`` (jittable; ``key`` is already the round's
key), plus ``models(state)``, the models to evaluate and which client each one scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule, sgd_client_update
from fedtree.core.model import Model
from fedtree.core.topology import Topology

PyTree = Any


class NodeModels(NamedTuple):
  """Stacked models ``params [N, ...]`` and ``model_of_client int32[C]`` (row scoring client c).

  Clustered methods also give ``cluster_of_client int32[C]`` (row ``k`` is cluster ``k``'s
  model): the evaluation then scores every row on every client and adds intra- and
  inter-cluster accuracy (:func:`fedtree.algorithms.clustering.ops.cluster_accuracy`). ``chosen_by_data``:
  a device picks its model from the data it is given (MCFL), so on another cluster's data it
  uses ``model_of_client`` of that data rather than its own cluster's model.
  """

  params: PyTree
  model_of_client: np.ndarray | jax.Array
  cluster_of_client: np.ndarray | jax.Array | None = None
  chosen_by_data: bool = False


class FederatedAlgorithm(NamedTuple):
  """``init(key) -> state``; ``round(state, data, key) -> (state, metrics)``;
  ``models(state) -> {name: NodeModels}``. ``name`` labels reports."""

  init: Callable[[jax.Array], Any]
  round: Callable[[Any, FederatedData, jax.Array], tuple[Any, dict[str, jax.Array]]]
  models: Callable[[Any], dict[str, NodeModels]]
  name: str = "algorithm"


@struct.dataclass
class TreeState:
  """Models and server-optimizer states of every server level of a tree.

  Attributes:
    round: ``int32[]`` rounds completed.
    params: per server level ``l = 0 .. depth-1``, stacked models ``[N_l, ...]``.
    opt_state: per server level, stacked optimizer states ``[N_l, ...]``.
    client_state: persistent per-client state ``[C, ...]`` (``()`` if none).
    cursor: ``int32[C]`` every client's batch cursor under ``batch_order="cyclic"``
      (:meth:`fedtree.core.local.LocalSchedule.init_cursor`; ``()`` for the other orders).
  """

  round: jax.Array
  params: tuple
  opt_state: tuple
  client_state: Any = ()
  cursor: Any = ()


def per_level(value, depth: int, name: str) -> tuple:
  """``value`` for every server level ``0 .. depth-1``: one value, or a sequence of ``depth``."""
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):  # NamedTuples are values
    if len(value) != depth:
      raise ValueError(f"{name} has {len(value)} entries for {depth} server levels (0..{depth - 1})")
    return tuple(value)
  return (value,) * depth


def stack(params: PyTree, n: int) -> PyTree:
  """``params`` repeated for ``n`` nodes or clients: every leaf ``[n, ...]``."""
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (n,) + jnp.shape(p)), params)


def broadcast_tree(init_params: PyTree, topology: Topology) -> tuple:
  """The same model at every node of every server level: ``params[l]`` is ``[N_l, ...]``."""
  return tuple(stack(init_params, topology.num_nodes(lv)) for lv in range(topology.depth))


def init_opt_states(optimizers: Sequence[optax.GradientTransformation], params: tuple) -> tuple:
  return tuple(jax.vmap(opt.init)(p) for opt, p in zip(optimizers, params, strict=True))


def local_training(
  client_update: ClientUpdate | None, model: Model, local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule, data: FederatedData, *, stateless_for: str | None = None,
) -> ClientUpdate:
  """``client_update``, or by default plain SGD local training for ``schedule`` on ``data``.

  With ``stateless_for`` (the algorithm's name), an update that keeps per-client state is
  refused: in those algorithms clients hold nothing but the model they receive.
  """
  if client_update is None:
    client_update = sgd_client_update(
      model, local_optimizer, batch_size=schedule.batch_size,
      max_steps=schedule.max_steps(data.max_train),
    )
  if stateless_for is not None and client_update.init_state is not None:
    raise ValueError(f"{stateless_for}: the client update must be stateless")
  return client_update


def client_weights(n_train: jax.Array, weighting: str) -> jax.Array:
  """Aggregation weight of every client: its number of examples, or 1."""
  if weighting == "examples":
    return n_train.astype(jnp.float32)
  if weighting == "uniform":
    return jnp.ones(n_train.shape, jnp.float32)
  raise ValueError(f"weighting={weighting!r}; choose 'examples' or 'uniform'")


def with_personal_models(algorithm: FederatedAlgorithm, name: str, params_of_state) -> FederatedAlgorithm:
  """``algorithm`` whose ``models()`` also returns ``name``: one model per client, read from
  the state by ``params_of_state(state) -> [C, ...]`` (Ditto's and pFedMe's personal models)."""

  def models(state):
    personal = params_of_state(state)
    num_clients = jax.tree.leaves(personal)[0].shape[0]
    return {**algorithm.models(state), name: NodeModels(personal, np.arange(num_clients, dtype=np.int32))}

  return algorithm._replace(models=models)
