"""Server optimizers: optax transformations applied to a node's pseudo-gradient.

A node's pseudo-gradient is ``Δ = Θ - Σ_i p_i θ_i`` (it points away from the children), so
any optax optimizer treats it as a gradient and FedAvg is exactly ``optax.sgd(1.0)``.
:func:`fedopt` is the FedAdagrad/FedAdam/FedYogi family of Reddi et al. 2021 in the paper's
form (``m_0 = 0``, ``v_0 = τ²``, no bias correction, τ outside the square root), with the
initial accumulator, the bias correction and its exponent offset as explicit options, and a
learning rate that may be an optax schedule. :func:`optimizer_from_config` builds any server
optimizer, optax optimizer or optax chain from a plain dict (a run config's ``server``).

Other codebases' FedAdam, as options of :func:`fedopt` (``kind="adam"``):

* Reddi et al. 2021 (the paper; FedML's and APPFL's FedAdam): the defaults.
* Flower (``flwr.server.strategy.FedAdam``, recent versions): ``initial_accumulator=0``,
  ``tau=1e-9``, ``bias_correction=True``, ``bias_correction_offset=1`` (Flower scales η by
  ``√(1-β2^(r+1)) / (1-β1^(r+1))`` with rounds ``r`` counted from 1, one power ahead of Adam).
* Kingma and Ba's Adam step size ``α_t`` (Keras' ``Adam`` as TFF's server optimizer):
  ``initial_accumulator=0``, ``bias_correction=True``, ``bias_correction_offset=0``.

Every node of a level keeps its own optimizer state: states are stacked ``[N, ...]`` and
:func:`update_nodes` ``vmap``s the update over the nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

PyTree = Any


class FedOptState(NamedTuple):
  """State of :func:`fedopt`."""

  count: jax.Array  # type: ignore[assignment]  # int32[] updates so far (shadows tuple.count)
  m: PyTree         # first moment, like params
  v: PyTree         # second moment / accumulator, like params


FEDOPT_KINDS = ("adagrad", "adam", "yogi")


def fedopt(
  kind: str,
  *,
  learning_rate: float | Callable[[jax.Array], jax.Array],
  b1: float = 0.9,
  b2: float = 0.99,
  tau: float = 1e-3,
  initial_accumulator: float | None = None,
  bias_correction: bool = False,
  bias_correction_offset: int = 0,
) -> optax.GradientTransformation:
  """FedAdagrad / FedAdam / FedYogi (Reddi et al. 2021, Algorithm 2).

  ``m ← β1 m + (1-β1) Δ``; Adagrad ``v ← v + Δ²``; Adam ``v ← β2 v + (1-β2) Δ²``; Yogi
  ``v ← v - (1-β2) Δ² sign(v - Δ²)``; step ``-η m / (√v + τ)``.

  Args:
    kind: ``"adagrad"``, ``"adam"`` or ``"yogi"``.
    learning_rate: server learning rate η, or an optax schedule ``η(count)`` of the number of
      server steps already taken (0 at the first step), as optax's optimizers call theirs.
    b1: β1 (FedAdagrad uses it too, as in the paper).
    b2: β2 (Adam, Yogi).
    tau: adaptivity τ.
    initial_accumulator: ``v_0``; default ``τ²`` as in the paper (0 reproduces simulators
      that start from zero).
    bias_correction: multiply the step by ``√(1-β2^e) / (1-β1^e)`` with ``e = t + offset``
      and ``t`` the step count from 1 (Adam-style).
    bias_correction_offset: the exponent's offset: 0 (Kingma and Ba's Adam, default) or 1
      (Flower's FedAdam, see the module docstring).
  """
  if kind not in FEDOPT_KINDS:
    raise ValueError(f"fedopt kind={kind!r}; choose one of {FEDOPT_KINDS}")
  for name, val in (("b1", b1), ("b2", b2)):
    if not 0.0 <= val < 1.0:
      raise ValueError(f"fedopt {name}={val} must be in [0, 1)")
  if tau < 0:
    raise ValueError(f"fedopt tau={tau} must be >= 0")
  v0 = tau**2 if initial_accumulator is None else float(initial_accumulator)
  if v0 < 0:
    raise ValueError(f"fedopt initial_accumulator={initial_accumulator} must be >= 0")
  if int(bias_correction_offset) != bias_correction_offset or bias_correction_offset < 0:
    raise ValueError(f"fedopt bias_correction_offset={bias_correction_offset!r} must be an int >= 0")
  offset = int(bias_correction_offset)

  def init(params):
    return FedOptState(
      count=jnp.zeros((), jnp.int32),
      m=jax.tree.map(jnp.zeros_like, params),
      v=jax.tree.map(lambda p: jnp.full_like(p, v0), params),
    )

  def update(delta, state, params=None):
    del params
    m = jax.tree.map(lambda m, d: b1 * m + (1 - b1) * d, state.m, delta)
    if kind == "adagrad":
      v = jax.tree.map(lambda v, d: v + d * d, state.v, delta)
    elif kind == "adam":
      v = jax.tree.map(lambda v, d: b2 * v + (1 - b2) * d * d, state.v, delta)
    else:
      v = jax.tree.map(lambda v, d: v - (1 - b2) * d * d * jnp.sign(v - d * d), state.v, delta)
    count = state.count + 1
    # Hyperparameters in the state's float dtype: float64 state is not stepped at float32.
    dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(state.m))
    if callable(learning_rate):
      lr = jnp.asarray(learning_rate(state.count), dtype)
    else:
      lr = jnp.asarray(learning_rate, dtype)
    if bias_correction:
      t = (count + offset).astype(dtype)
      lr = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    updates = jax.tree.map(lambda m, v: -lr * m / (jnp.sqrt(v) + tau), m, v)
    return updates, FedOptState(count=count, m=m, v=v)

  return optax.GradientTransformation(init, update)


SERVER_OPTIMIZERS = ("fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi")


def server_optimizer(name: str, **hparams) -> optax.GradientTransformation:
  """A server optimizer by name.

  * ``fedavg``: ``sgd(learning_rate=1.0)``;
  * ``fedavgm``: ``sgd(learning_rate=1.0, momentum=0.9)`` (heavy ball on Δ);
  * ``fedadagrad`` / ``fedadam`` / ``fedyogi``: :func:`fedopt` (paper form by default);
  * any other name is an optax optimizer, e.g. ``("adam", learning_rate=1e-2)``.
  """
  hparams = dict(hparams)
  if name == "fedavg":
    return optax.sgd(hparams.pop("learning_rate", 1.0), **hparams)
  if name == "fedavgm":
    return optax.sgd(hparams.pop("learning_rate", 1.0), momentum=hparams.pop("momentum", 0.9), **hparams)
  if name in ("fedadagrad", "fedadam", "fedyogi"):
    if "learning_rate" not in hparams:
      raise ValueError(f"server optimizer {name!r} needs a learning_rate")
    return fedopt(name[3:], **hparams)
  return optimizer_by_name(name, **hparams)


def optimizer_by_name(name: str, **hparams) -> optax.GradientTransformation:
  """Any optax optimizer factory by name (``sgd``, ``adam``, ``adamw``, ...)."""
  factory = getattr(optax, name, None) if isinstance(name, str) else None
  if factory is None or not callable(factory):
    raise ValueError(
      f"optimizer {name!r} is neither one of {SERVER_OPTIMIZERS}, {CHAIN!r} (in a config) nor "
      f"an optax optimizer or transformation (e.g. 'adam', 'clip_by_global_norm')"
    )
  try:
    return factory(**hparams)
  except TypeError as e:
    raise ValueError(f"optimizer {name!r} rejected hyperparameters {hparams}: {e}") from e


CHAIN = "chain"


def schedule_from_config(cfg: Mapping[str, Any]) -> Callable[[jax.Array], jax.Array]:
  """An optax schedule from ``{"name": <optax schedule>, **its arguments}``, e.g.
  ``{"name": "exponential_decay", "init_value": 0.1, "transition_steps": 10, "decay_rate": 0.5}``."""
  cfg = dict(cfg)
  name = cfg.pop("name", None)
  factory = getattr(optax.schedules, name, None) if isinstance(name, str) else None
  if factory is None or not callable(factory) or name.startswith("_") or not name.endswith(
    ("schedule", "decay")
  ):
    known = sorted(n for n in dir(optax.schedules)
                   if n.endswith(("schedule", "decay")) and not n.startswith("_"))
    raise ValueError(f"learning-rate schedule name={name!r}; choose one of {known}")
  try:
    return factory(**cfg)
  except TypeError as e:
    raise ValueError(f"schedule {name!r} rejected arguments {cfg}: {e}") from e


def optimizer_from_config(cfg: Mapping[str, Any] | None) -> optax.GradientTransformation:
  """A server optimizer from a plain dict (a run config's ``server``; ``None``: FedAvg).

  ``{"name": n, **hparams}`` is :func:`server_optimizer` ``(n, **hparams)``: one of
  :data:`SERVER_OPTIMIZERS` or any optax optimizer or transformation (``adam``,
  ``clip_by_global_norm``, ``add_decayed_weights``, ...). ``{"name": "chain", "transforms":
  [cfg, ...]}`` is ``optax.chain`` of each transform's optimizer, in order, e.g.
  ``{"name": "chain", "transforms": [{"name": "clip_by_global_norm", "max_norm": 1.0},
  {"name": "adam", "learning_rate": 0.01}]}``. A hyperparameter given as a dict with a
  ``name`` (e.g. ``learning_rate``) is an optax schedule (:func:`schedule_from_config`).
  """
  if cfg is None:
    return server_optimizer("fedavg")
  if not isinstance(cfg, Mapping):
    raise ValueError(f"server optimizer config {cfg!r} must be a dict with a 'name'")
  hparams = dict(cfg)
  name = hparams.pop("name", "fedavg")
  if name == CHAIN:
    transforms = hparams.pop("transforms", None)
    if hparams or not isinstance(transforms, (list, tuple)) or not transforms:
      raise ValueError(
        f"server optimizer 'chain' takes one field, a non-empty list 'transforms'; got "
        f"transforms={transforms!r} and {sorted(hparams)}"
      )
    return optax.chain(*(optimizer_from_config(t) for t in transforms))
  hparams = {k: schedule_from_config(v) if isinstance(v, Mapping) and "name" in v else v
             for k, v in hparams.items()}
  return server_optimizer(name, **hparams)


def init_nodes(opt: optax.GradientTransformation, params: PyTree) -> PyTree:
  """Stacked optimizer states for stacked node params ``[N, ...]``."""
  return jax.vmap(opt.init)(params)


def update_nodes(
  opt: optax.GradientTransformation,
  params: PyTree,
  opt_state: PyTree,
  pseudo_grad: PyTree,
  active: jax.Array,
) -> tuple[PyTree, PyTree]:
  """One server step on every node where ``active[N]`` holds; others keep params and state."""

  def one(p, s, g):
    updates, s = opt.update(g, s, p)
    return optax.apply_updates(p, updates), s

  new_params, new_state = jax.vmap(one)(params, opt_state, pseudo_grad)
  return select_nodes(active, new_params, params), select_nodes(active, new_state, opt_state)


def select_nodes(mask: jax.Array, new: PyTree, old: PyTree) -> PyTree:
  """Per-node ``where``: rows of ``new`` where ``mask[N]`` holds, else rows of ``old``."""

  def sel(a, b):
    if not hasattr(a, "ndim") or a.ndim == 0:
      return a
    return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

  return jax.tree.map(sel, new, old)


def down_nodes(
  opt: optax.GradientTransformation, params: PyTree, opt_state: PyTree, target: PyTree,
  active: jax.Array,
) -> tuple[PyTree, PyTree]:
  """Every active node pulls towards ``target`` (B-HFL's down step, paper 001): it applies
  ``opt`` to ``Δ = θ - Θ_target``.

  Computed as ``Θ_target + (Δ + update)``, so ``sgd(1.0)`` yields ``Θ_target`` bit for bit.
  """

  def one(p, s, t):
    d = jax.tree.map(jnp.subtract, p, t)
    upd, s = opt.update(d, s, p)
    return jax.tree.map(lambda t_, d_, u_: t_ + (d_ + u_), t, d, upd), s

  new_p, new_s = jax.vmap(one)(params, opt_state, target)
  return select_nodes(active, new_p, params), select_nodes(active, new_s, opt_state)
