"""Sharding the client axis over devices: one program on 1 CPU, 8 GPUs or a TPU pod.

Every tier of the tree is an array axis (DESIGN.md), so scaling out is data parallelism
over clients: the client-stacked data ``[C, ...]`` and per-client state are laid out over a
1-D :class:`jax.sharding.Mesh` with axis :data:`CLIENT_AXIS`, and inside a round every
chunk of the cohort (``[chunk, ...]``) is constrained to the same axis, so each device
trains its slice of the chunk and XLA turns the ``segment_sum`` into a cross-device
reduction. Nothing here is home-made communication: the mesh is installed with
``jax.set_mesh`` (JAX's own context), and :func:`fedtree.core.tier.train_cohort` asks
:func:`constrain_clients` to place its chunks whenever such a mesh is current; without a
mesh every function here is the identity, so single-device code is unchanged.

Several hosts: call :func:`initialize_distributed` (``jax.distributed.initialize()``)
first; :func:`client_mesh` then spans the devices of every host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fedtree.core.data import _ARRAY_FIELDS, FederatedData

PyTree = Any
CLIENT_AXIS = "clients"


def initialize_distributed(**kwargs) -> None:
  """``jax.distributed.initialize(**kwargs)``: joins the hosts of a multi-host run.

  Call it before any other JAX call; every host then runs the same program.
  """
  jax.distributed.initialize(**kwargs)


def client_mesh(
  mesh_shape: int | Sequence[int] | None = None, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """A 1-D mesh over ``mesh_shape`` devices (default: all of them) with axis ``clients``.

  Args:
    mesh_shape: number of devices (an int or a one-element sequence), ``None`` or ``-1`` for
      all devices.
    devices: the devices to use (default ``jax.devices()``, every host's).

  Raises:
    ValueError: more devices asked for than exist, or a shape with more than one axis.
  """
  devices = list(jax.devices() if devices is None else devices)
  if isinstance(mesh_shape, Sequence):   # a list or tuple
    if len(mesh_shape) != 1:
      raise ValueError(f"mesh_shape={tuple(mesh_shape)}: only a 1-D client mesh is supported")
    mesh_shape = mesh_shape[0]
  n = len(devices) if mesh_shape in (None, -1) else int(mesh_shape)
  if not 1 <= n <= len(devices):
    raise ValueError(f"mesh_shape={mesh_shape} asks for {n} devices; {len(devices)} exist")
  return Mesh(np.asarray(devices[:n]), (CLIENT_AXIS,))


def mesh_size(mesh: Mesh | None = None) -> int:
  """Devices along the client axis of ``mesh`` (default: the current ``jax.set_mesh``), or 1."""
  m = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  if m is None or m.empty or CLIENT_AXIS not in m.axis_names:
    return 1
  return int(m.shape[CLIENT_AXIS])


def client_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
  """Leading axis over ``clients`` when it divides evenly, else replicated."""
  n = mesh_size(mesh)
  if len(shape) and shape[0] % n == 0:
    return NamedSharding(mesh, P(CLIENT_AXIS))
  return NamedSharding(mesh, P())


def shard_clients(tree: PyTree, mesh: Mesh) -> PyTree:
  """Places every leaf ``[C, ...]`` of ``tree`` with its client axis over ``mesh``.

  Leaves whose leading axis does not divide by the mesh size are replicated (correct, but
  each device then holds all of it).
  """
  return jax.tree.map(lambda a: jax.device_put(a, client_sharding(mesh, np.shape(a))), tree)


def shard_data(data: FederatedData, mesh: Mesh) -> FederatedData:
  """The federated data with every per-client array sharded over ``mesh``'s client axis.

  A ragged training split (:attr:`FederatedData.train_offset`) keeps its flat ``x_train`` /
  ``y_train`` on every device (any client may read any row); its counts and offsets are
  per-client and sharded."""
  if not data.ragged:
    return dataclasses.replace(data, **shard_clients({f: getattr(data, f) for f in _ARRAY_FIELDS}, mesh))
  per_client = ("n_train", "x_test", "y_test", "n_test", "train_offset")
  return dataclasses.replace(data, **shard_clients({f: getattr(data, f) for f in per_client}, mesh),
                             **replicate({"x_train": data.x_train, "y_train": data.y_train}, mesh))


def replicate(tree: PyTree, mesh: Mesh) -> PyTree:
  """Every leaf of ``tree`` on every device of ``mesh`` (server models and states)."""
  return jax.device_put(tree, NamedSharding(mesh, P()))


def barrier(name: str) -> None:
  """Waits until every process of a multi-process run reaches the barrier ``name`` (all must
  call it, in the same order); nothing in a one-process run."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
  """Whether ``flag`` is true in any process of a multi-process run (a collective: every process
  calls it at the same point, and all get the same answer); ``flag`` itself in a one-process run.
  How a stop request that reached one process (a signal sent to one host) stops them all at the
  same round, instead of leaving the others waiting in a collective."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils

  return bool(np.any(multihost_utils.process_allgather(np.asarray(bool(flag)))))


def agreed(should_stop: Callable[[], bool] | None) -> Callable[[], bool] | None:
  """``should_stop`` polled in every process and true when it is true in any
  (:func:`any_process`); as it is in a one-process run."""
  if should_stop is None or jax.process_count() == 1:
    return should_stop
  return lambda: any_process(should_stop())


def _spans_processes(a) -> bool:
  return isinstance(a, jax.Array) and not a.is_fully_addressable and not a.is_fully_replicated


def local_copy(tree: PyTree) -> PyTree:
  """``tree`` with every leaf spread over the devices of several processes gathered into a
  numpy array (a collective, like :func:`to_host`); other leaves (PRNG keys included) are
  returned as they are. The identity in a one-process run."""
  if not any(_spans_processes(a) for a in jax.tree.leaves(tree)):
    return tree
  from jax.experimental import multihost_utils

  return jax.tree.map(
    lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True)) if _spans_processes(a) else a,
    tree)


def to_host(tree: PyTree) -> PyTree:
  """Every leaf of ``tree`` as a numpy array, in every process.

  A leaf spread over the devices of several processes (``--multihost``: per-client state and
  evaluation results sharded over a mesh that spans hosts) is gathered with
  :func:`jax.experimental.multihost_utils.process_allgather`, a collective: every process
  must call this with the same tree. Leaves this process can read whole (one process, or
  replicated values) are copied directly.
  """

  return jax.tree.map(np.asarray, local_copy(tree))


def constrain_clients(tree: PyTree) -> PyTree:
  """Inside jit: asks for the leading (client) axis of every leaf over the current mesh.

  The identity when no mesh with a ``clients`` axis is set, or when a leaf's leading axis
  does not divide by the number of devices (then XLA keeps its own choice).
  """
  n = mesh_size()
  if n == 1:
    return tree

  def one(a):
    if a.ndim == 0 or a.shape[0] % n:
      return a
    return jax.lax.with_sharding_constraint(a, P(CLIENT_AXIS))

  return jax.tree.map(one, tree)
