"""Initial weights from a file: every run of a config can start from saved parameters.

``config.init_params = "/path/to/params.npz"`` (every run) or ``config.runs.<label>.init_params``
(one run; it wins over the config's) names either

* a flat ``.npz`` whose keys are the ``/``-joined pytree paths of the model's parameters
  (``Dense_0/kernel``), as :func:`save_params` writes, or
* an orbax checkpoint directory of the parameter pytree (``save_params`` with a path not ending
  in ``.npz``, i.e. ``orbax.checkpoint.StandardCheckpointer().save(path, params)``).

:func:`load_params` reads it and checks it against the model's initial parameters
(:func:`jax.eval_shape` of ``model.init``, nothing allocated): the same leaves, each of the
same shape; a difference is a ``ValueError`` naming the first mismatching leaf and both
shapes. Leaves are cast to the model's dtypes. The runner loads ``config.init_params`` once
into :class:`~fedtree.experiment.context.Context` and the registry passes the parameters to
every algorithm factory as ``init_params`` (GroupPerFL: its first, global stage).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.model import Model

PyTree = Any


def _key_name(k) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def leaf_name(path) -> str:
  """The ``/``-joined name of a :func:`jax.tree_util.tree_flatten_with_path` path."""
  return "/".join(_key_name(k) for k in path)


def flatten_params(params: PyTree) -> dict[str, np.ndarray]:
  """``{"/"-joined path: host array}`` of every leaf of ``params``."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  out = {}
  for path, leaf in leaves:
    name = leaf_name(path)
    if name in out:
      raise ValueError(f"two leaves of the parameters share the name {name!r}")
    out[name] = np.asarray(leaf)
  return out


def save_params(path: str, params: PyTree) -> str:
  """Writes ``params`` to ``path``: a flat ``.npz`` keyed by ``/``-joined pytree paths when
  ``path`` ends in ``.npz``, else an orbax checkpoint directory. Returns ``path``."""
  path = os.fspath(path)
  if path.endswith(".npz"):
    flat = flatten_params(params)
    with open(path, "wb") as f:   # a file object: numpy adds no second ".npz"
      np.savez(f, **flat)
    return path
  import orbax.checkpoint as ocp

  ckpt = ocp.StandardCheckpointer()
  ckpt.save(os.path.abspath(path), params)
  ckpt.wait_until_finished()
  return path


def _read(path: str) -> dict[str, np.ndarray]:
  if os.path.isdir(path):
    import orbax.checkpoint as ocp

    try:
      tree = ocp.StandardCheckpointer().restore(os.path.abspath(path))
    except Exception as e:  # noqa: BLE001 - re-raised naming the path and what it should be
      raise ValueError(f"init_params={path!r} is a directory but not an orbax checkpoint of a "
                       f"parameter pytree: {type(e).__name__}: {e}") from e
    return flatten_params(tree)
  if not os.path.exists(path):
    raise FileNotFoundError(f"init_params={path!r} does not exist (a .npz file or an orbax directory)")
  with np.load(path, allow_pickle=False) as z:
    return {k: z[k] for k in z.files}


def check_params(flat: dict[str, np.ndarray], like: PyTree, *, source: str = "init_params") -> PyTree:
  """``flat`` (``{name: array}``) as a pytree shaped like ``like`` (arrays or
  :class:`jax.ShapeDtypeStruct`), cast to its dtypes.

  Raises:
    ValueError: a leaf of ``like`` is missing from ``flat``, ``flat`` has a leaf ``like``
      lacks, or a leaf's shape differs (the first such leaf is named with both shapes).
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
  names = [leaf_name(p) for p, _ in leaves]
  out = []
  for name, (_, ref) in zip(names, leaves, strict=True):
    if name not in flat:
      raise ValueError(f"{source} has no leaf {name!r} (the model's has shape {tuple(ref.shape)}); "
                       f"it has {sorted(flat)}")
    got = np.asarray(flat[name])
    if got.shape != tuple(ref.shape):
      raise ValueError(f"{source} leaf {name!r} has shape {got.shape}, the model's has shape "
                       f"{tuple(ref.shape)}")
    out.append(jnp.asarray(got, dtype=ref.dtype))
  extra = sorted(set(flat) - set(names))
  if extra:
    raise ValueError(f"{source} has leaves the model lacks: {extra}; the model's are {names}")
  return jax.tree_util.tree_unflatten(treedef, out)


def load_params(path: str, model: Model) -> PyTree:
  """The parameters saved at ``path`` (module docstring), checked against ``model.init``'s
  shapes and cast to its dtypes."""
  like = jax.eval_shape(model.init, jax.random.key(0))
  return check_params(_read(os.fspath(path)), like, source=f"init_params={os.fspath(path)!r}")
