"""Differential privacy on the update path (:mod:`fedtree.core.updates`): per-client clipping,
Gaussian noise (central at the aggregating nodes of any level, or local at every client) and
adaptive clipping (Andrew et al. 2021).

The unit of privacy is a client (user-level DP). Every aggregation weight must be 1
(``weighting="uniform"``): with example-count weights one client's contribution to the sum is
unbounded, so :func:`check_private_weighting` refuses them.

* :func:`clip` (a :class:`~fedtree.core.updates.ClientTransform`): every client's delta scaled to
  L2 norm at most ``C`` (over the whole model, or ``C / sqrt(L)`` per leaf with ``per_layer``);
  ``C`` is a number (possibly traced: a sweep axis) or, with adaptive clipping, the parent's node
  state that the client reads through ``ctx.node_state``;
* :func:`local_noise` (a client transform): ``N(0, (z C)^2)`` added to each clipped delta;
* :func:`central` (a :class:`~fedtree.core.updates.NodeTransform`): ``N(0, (s z C)^2)`` added once
  to each node's ``delta_sum``, with ``s`` the sensitivity factor of the normalisation
  (McMahan et al. 2018): ``normalize="fixed"`` divides by the expected cohort weight (one
  client's add/remove moves the sum by at most ``C``: ``s = 1``, what the sampled-Gaussian
  accounting of Poisson sampling assumes); ``normalize="count"`` divides by the actual number of
  reports (the count is then public: fixed-size cohorts, replace-one adjacency, ``s = 2``).
  With an :class:`Adaptive` rule it also holds the clip norm ``C`` per node and updates it
  geometrically from the noised count of unclipped clients.

No hyperparameter goes through ``float()``: ``noise_multiplier`` and ``clip_norm`` may be traced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedtree.core.updates import ClientContext, ClientTransform, NodeTransform, UpdatePath

PyTree = Any
NORMALIZATIONS = ("fixed", "count")
UNCLIPPED = "dp_unclipped"
"""The client statistic (1 when a client's norm was at most its clip norm) that adaptive
clipping counts."""


def check_private_weighting(weighting: str) -> str:
  """``weighting`` if DP can bound a client's contribution under it (``"uniform"``), else a
  ``ValueError`` that says why (which weightings exist: :func:`fedtree.core.algorithm.check_weighting`)."""
  if weighting != "uniform":
    raise ValueError(f"differential privacy needs weighting='uniform' (got weighting={weighting!r}): with "
                     f"example-count weights one client's contribution to the aggregate, hence the "
                     f"sensitivity, is unbounded")
  return weighting


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def check_noise_multiplier(z) -> None:
  """A concrete ``z`` must be a finite number >= 0 (a traced one is the sweep's to check)."""
  if _is_concrete(z) and not (isinstance(z, (int, float)) or jnp.ndim(z) == 0):
    raise ValueError(f"noise_multiplier={z!r}; it must be one number >= 0")
  if _is_concrete(z) and not (math.isfinite(float(z)) and float(z) >= 0):
    raise ValueError(f"noise_multiplier={z!r}; it must be a finite number >= 0")


def check_clip_norm(c) -> None:
  """A concrete clip norm must be > 0 (``inf``: no clipping)."""
  if _is_concrete(c) and not (float(c) > 0):   # NaN fails too
    raise ValueError(f"clip_norm={c!r}; it must be > 0 (inf: no clipping)")


def global_norm(tree: PyTree) -> jax.Array:
  """The L2 norm of every leaf of ``tree`` together, in the default float dtype (float64 under
  ``--config.dtype=float64``)."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.result_type(float)))) for x in jax.tree.leaves(tree)))


def state_dtype(params: PyTree):
  """The float dtype of a transform's state that follows the model: float32, or wider where the
  parameters are (float64 under ``config.dtype="float64"``); never narrower (bfloat16 params
  still get a float32 state)."""
  floats = [x.dtype for x in jax.tree.leaves(params)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
  return jnp.result_type(jnp.float32, *floats)


def _scale(norm, c):
  """``min(1, c / norm)`` with 1.0 exactly where no clipping happens (so ``inf`` is bitwise the
  identity) and no ``0/0``."""
  return jnp.where(norm > c, c / jnp.where(norm > 0, norm, 1.0), 1.0)


def clip_norm_of(ctx: ClientContext, clip_norm, node_name: str | None):
  """The clip norm a client uses: ``clip_norm``, or its parent's adaptive one
  (``ctx.node_state[node_name]["clip"]``)."""
  if node_name is None:
    return jnp.asarray(clip_norm, jnp.result_type(float))
  return ctx.node_state[node_name]["clip"]


def clip(clip_norm=None, *, per_layer: bool = False, adaptive_node: str | None = None,
         name: str = "dp_clip") -> ClientTransform:
  """Every client's delta clipped to L2 norm ``clip_norm`` (whole model), or each leaf to
  ``clip_norm / sqrt(L)`` (``per_layer``, ``L`` leaves: the whole delta's norm is then at most
  ``clip_norm`` too).

  Args:
    clip_norm: ``C > 0`` (``inf``: no clipping); may be traced. Ignored with ``adaptive_node``.
    per_layer: clip each leaf separately.
    adaptive_node: the name of the :func:`central` node transform holding the adaptive clip norm.
    name: the transform's name.

  Statistics: ``dp_unclipped`` (1 if the client's norm was within its bound) and
  ``dp_update_norm`` (its norm before clipping).
  """
  if adaptive_node is None:
    check_clip_norm(clip_norm)

  def apply(delta, state, key, ctx):
    c = clip_norm_of(ctx, clip_norm, adaptive_node)
    norm = global_norm(delta)
    if per_layer:
      leaves, treedef = jax.tree.flatten(delta)
      c_leaf = c / jnp.sqrt(jnp.asarray(len(leaves), jnp.result_type(float)))
      norms = [global_norm(x) for x in leaves]
      leaves = [(x * _scale(n, c_leaf).astype(x.dtype)) for x, n in zip(leaves, norms, strict=True)]
      out = jax.tree.unflatten(treedef, leaves)
      unclipped = jnp.all(jnp.stack([n <= c_leaf for n in norms]))
    else:
      s = _scale(norm, c)
      out = jax.tree.map(lambda x: x * s.astype(x.dtype), delta)
      unclipped = norm <= c
    return out, state, {UNCLIPPED: unclipped.astype(jnp.result_type(float)), "dp_update_norm": norm}

  return ClientTransform(apply, name=name)


def _gaussian_like(tree: PyTree, key: jax.Array, std) -> PyTree:
  """``N(0, std^2)`` noise shaped like ``tree`` (``std`` broadcast from the leading axes it has)."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  std = jnp.asarray(std, jnp.result_type(float))

  def one(x, k):
    s = std.reshape(std.shape + (1,) * (x.ndim - std.ndim))
    return x + (s * jax.random.normal(k, x.shape, jnp.promote_types(x.dtype, jnp.float32))).astype(x.dtype)

  return jax.tree.unflatten(treedef, [one(x, k) for x, k in zip(leaves, keys, strict=True)])


def _std(z, c, factor=1.0):
  """``factor * z * c``, and 0 where ``z`` is 0 (so ``z = 0`` with ``c = inf`` adds nothing)."""
  z = jnp.asarray(z, jnp.result_type(float))
  return jnp.where(z > 0, factor * z * jnp.asarray(c, jnp.result_type(float)), 0.0)


def local_noise(noise_multiplier, clip_norm=None, *, adaptive_node: str | None = None,
                name: str = "dp_local_noise") -> ClientTransform:
  """``N(0, (z C)^2)`` added by every client to its (clipped: chain it after :func:`clip`) delta.
  ``C`` as in :func:`clip`."""
  check_noise_multiplier(noise_multiplier)
  if adaptive_node is None:
    check_clip_norm(clip_norm)

  def apply(delta, state, key, ctx):
    c = clip_norm_of(ctx, clip_norm, adaptive_node)
    return _gaussian_like(delta, key, _std(noise_multiplier, c)), state, {}

  return ClientTransform(apply, name=name)


class Adaptive(NamedTuple):
  """Adaptive clipping (Andrew et al. 2021, "Differentially private learning with adaptive
  clipping"): after each round every node sets ``C <- C exp(-lr (b - target_quantile))`` with
  ``b = (unclipped + N(0, count_noise^2)) / n`` the noised fraction of its clients whose norm was
  within ``C`` (``n`` the expected cohort weight with ``normalize="fixed"``, else the count).

  Attributes:
    initial_clip: ``C`` of the first round (> 0).
    target_quantile: ``γ`` in [0, 1].
    learning_rate: ``η_C`` (0.2 in the paper).
    count_noise: std ``σ_b`` of the count's noise (the paper: expected cohort / 20).
  """

  initial_clip: Any = 0.1
  target_quantile: Any = 0.5
  learning_rate: Any = 0.2
  count_noise: Any = 0.0


def check_adaptive(adaptive: Adaptive) -> Adaptive:
  """``adaptive`` if its concrete fields make sense, else a ``ValueError`` naming the field:
  ``initial_clip > 0``, ``target_quantile`` in [0, 1], ``learning_rate >= 0`` (a negative one
  moves the clip norm away from the quantile), ``count_noise >= 0``."""
  rules = (("initial_clip", lambda v: v > 0, "> 0 (the first round's clip norm)"),
           ("target_quantile", lambda v: 0 <= v <= 1, "in [0, 1] (the share of clients left unclipped)"),
           ("learning_rate", lambda v: v >= 0, ">= 0 (a negative rate drives the clip norm away from the "
                                               "target quantile)"),
           ("count_noise", lambda v: v >= 0, ">= 0 (the std of the unclipped count's noise)"))
  for field, ok, need in rules:
    v = getattr(adaptive, field)
    if _is_concrete(v) and not (math.isfinite(float(v)) and ok(float(v))):
      raise ValueError(f"adaptive {field}={v!r} must be {need}")
  return adaptive


def adaptive_step(clip_norm, unclipped, count, adaptive: Adaptive, noise):
  """One adaptive-clipping step: the new clip norm from the old one, the number of unclipped
  clients, the normalising count, and ``noise`` (``N(0, 1)`` draws, scaled here by
  ``count_noise``)."""
  b = (unclipped + adaptive.count_noise * noise) / jnp.maximum(count, 1e-12)
  return clip_norm * jnp.exp(-adaptive.learning_rate * (b - adaptive.target_quantile))


def central(noise_multiplier, clip_norm=None, *, normalize: str = "count", expected_weight=None,
            adaptive: Adaptive | None = None, add_noise: bool = True, sensitivity_scale=1.0,
            name: str = "dp") -> NodeTransform:
  """Gaussian noise added once to every aggregating node's ``delta_sum`` (central DP; at any
  server level by the path it sits in), the normalisation, and adaptive clipping's per-node clip
  norm.

  Args:
    noise_multiplier: ``z >= 0`` (may be traced).
    clip_norm: the clients' fixed clip norm ``C`` (without ``adaptive``).
    normalize: ``"fixed"`` (the pseudo-gradient is ``delta_sum / expected_weight``, noise std
      ``z C``) or ``"count"`` (``delta_sum / weight_sum``, noise std ``2 z C``: see the module
      docstring).
    expected_weight: the expected cohort weight of a node (a number, or ``[P]``), needed by
      ``"fixed"``.
    adaptive: the adaptive clipping rule (its state ``{"clip": [P]}`` is what :func:`clip` reads
      with ``adaptive_node=name``).
    add_noise: ``False``: only the normalisation and the adaptive clip norm (local DP).
    sensitivity_scale: multiplies the noise std: how far one client can move this node's
      ``delta_sum`` in units of ``C`` (1 at the clients' parents; at an upper level the caller's
      bound, e.g. a child's weight over its expected cohort).
    name: the transform's name (its state's key).

  Statistics: ``dp_clip_norm`` (the clip norm this round), ``dp_noise_std`` (the std added to
  the sum).
  """
  check_noise_multiplier(noise_multiplier)
  if normalize not in NORMALIZATIONS:
    raise ValueError(f"normalize={normalize!r}; choose one of {list(NORMALIZATIONS)}")
  if normalize == "fixed" and expected_weight is None:
    raise ValueError("normalize='fixed' needs expected_weight (the expected cohort weight of a node)")
  if adaptive is None:
    check_clip_norm(clip_norm)
  else:
    check_clip_norm(adaptive.initial_clip)
    q = adaptive.target_quantile
    if _is_concrete(q) and not 0 <= float(q) <= 1:
      raise ValueError(f"adaptive.target_quantile={q!r}; it must be in [0, 1]")
  factor = 1.0 if normalize == "fixed" else 2.0

  def init(params, num):
    if adaptive is None:
      return ()
    # the clip norm is a model quantity: float64 in a float64 run, float32 otherwise (bfloat16 too)
    return {"clip": jnp.full((num,), adaptive.initial_clip, state_dtype(params))}

  def apply(delta_sum, weight_sum, client_stats, state, key):
    num = weight_sum.shape[0]
    if adaptive is not None:
      c = state["clip"]
    else:
      c = jnp.broadcast_to(jnp.asarray(clip_norm, jnp.result_type(float)), (num,))
    std = _std(noise_multiplier, c, factor) * sensitivity_scale
    std = std if add_noise else jnp.zeros((num,), std.dtype)
    if add_noise:
      delta_sum = _gaussian_like(delta_sum, jax.random.fold_in(key, 0), std)
    if normalize == "fixed":
      count = jnp.broadcast_to(jnp.asarray(expected_weight, weight_sum.dtype), weight_sum.shape)
      weight_sum = count
    else:
      count = client_stats["reported"]
    if adaptive is not None:
      noise = jax.random.normal(jax.random.fold_in(key, 1), (num,), jnp.result_type(float))
      new_clip = adaptive_step(c, client_stats[UNCLIPPED], count, adaptive, noise)
      state = {"clip": new_clip.astype(c.dtype)}   # a carried state keeps its dtype (scan, donation)
    return delta_sum, weight_sum, state, {"dp_clip_norm": c, "dp_noise_std": std}

  return NodeTransform(apply, init, name=name)


def private_stages(path) -> list[str]:
  """The names of the stages of an update path that privatize the update (this module's clipping,
  local noise and central noise: named ``dp*``, alone or in a chain), for the methods that send
  something beside the update, outside the path, and must refuse them."""
  if path is None:
    return []
  names = [t.name for t in (path.client, path.node) if t is not None]
  return [n for n in names if any(part.startswith("dp") for part in n.split("+"))]


def private_stages_where(paths) -> list[str]:
  """Every privacy stage (:func:`private_stages`) of ``paths`` (as
  :func:`fedtree.core.updates.per_level_paths` takes them: one path, a sequence or ``{level:
  path}``), each as ``"'<transform>' at <where>"``: for the refusals of methods whose clients send
  something beside their update that no privacy stage covers at any level (q-FFL's ``h_k``, AFL's
  losses)."""
  if paths is None:
    return []
  if isinstance(paths, UpdatePath):
    items: list = [("the clients' tier", paths)]
  elif isinstance(paths, Mapping):
    items = [("the clients' tier" if int(lv) == -1 else f"level {lv}", p) for lv, p in paths.items()]
  else:
    items = [(f"level {lv}", p) for lv, p in enumerate(paths)]
  return [f"{n!r} at {where}" for where, p in items for n in private_stages(p)]


def delta_noise_multiplier(noise_multiplier, adaptive: Adaptive | None, *, replace_one: bool = True):
  """The noise multiplier of the deltas that keeps the overall one at ``noise_multiplier`` when
  adaptive clipping also releases a noised count (Andrew et al. 2021, Thm. 1):
  ``z_Δ = (z^-2 - (f σ_b)^-2)^(-1/2)``, ``σ_b`` the count's noise std, ``f`` = 2 under add/remove
  adjacency (the centred count moves by 1/2; the paper's), 1 under replace-one (by 1).

  Raises:
    ValueError: (concrete values) the count's noise alone spends the whole budget ``z``.
  """
  if adaptive is None:
    return noise_multiplier
  f = 1.0 if replace_one else 2.0
  sb = jnp.asarray(adaptive.count_noise, jnp.result_type(float))
  z = jnp.asarray(noise_multiplier, jnp.result_type(float))
  if _is_concrete(noise_multiplier) and _is_concrete(adaptive.count_noise):
    zf, sbf = float(noise_multiplier), float(adaptive.count_noise)
    if zf > 0 and f * sbf <= zf:
      raise ValueError(f"adaptive.count_noise={adaptive.count_noise!r} is too small for "
                       f"noise_multiplier={noise_multiplier!r}: the count's release alone would spend the "
                       f"budget; it needs count_noise > {zf / f:.4g}")
  return jnp.where(z > 0, 1.0 / jnp.sqrt(jnp.maximum(z ** -2.0 - (f * sb) ** -2.0, 1e-30)), 0.0)
