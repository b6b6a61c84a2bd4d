"""FedDyn (Acar et al. 2021, "Federated learning based on dynamic regularization"), Algorithm 1,
on any tree, built on the server-rule seam (:mod:`fedtree.core.server_rule`).

Every client ``i`` keeps ``∇L_i``, the gradient of its loss at its last local model
(``TreeState.client_state [C, ...]``, zeros at the start), and every parent of clients keeps ``h``
(``TreeState.server_state [N, ...]``, zeros). A sampled client starts from the model ``x`` it
receives and minimizes its dynamically regularized loss

  ``L_i(θ) − ⟨∇L_i, θ⟩ + (α/2) ‖θ − x‖²``

by its local steps (any optax local optimizer; SGD in the paper), then updates
``∇L_i ← ∇L_i − α (θ_i − x)`` and sends ``θ_i`` (one model, as FedAvg: nothing else travels, and
the byte columns count one model each way). The server, over the clients ``P`` that answered:

  ``h ← h − α (1/m) Σ_{i∈P} (θ_i − x)``,  ``x ← (1/|P|) Σ_{i∈P} θ_i − h/α``

with ``m`` its number of clients. In fedtree's terms the pseudo-gradient ``x − mean θ_i`` goes on
with ``h/α`` added, through the parent's optax server optimizer (``sgd(1.0)``: the paper's step).
``h`` is moved by the update path's aggregate (``pseudo_gradient · weight_sum / population_weight``
is ``(1/m) Σ_{i∈P} (x − θ_i)``), so clipping, noise and compression act on what it sees, as on the
model; a client's own ``∇L_i`` uses its own ``θ_i``. With ``α = 0`` the regularizer and ``h``
vanish and every round is FedAvg's (the paper's ``h/α`` is ``0/0`` there and is taken as 0; note
that ``h/α = −(1/m) Σ_t Σ_{i∈P_t} (θ_i − x)`` does not vanish as ``α → 0``, so α = 0 is FedAvg by
this definition, not as a limit). ``α`` is traced, so it can be a sweep axis.

**On a tree** ``h`` lives at the clients' parents: every parent of clients (an edge server) runs
FedDyn's server over its own clients (``m`` its clients), each client's regularizer pulls towards
its own parent's model, and the levels above aggregate models as HierFAVG every ``periods[l]``
rounds. The dynamic regularizer aligns a client's stationary point with its server's, which is
where the local steps happen; the paper's analysis is for one server, and the edges above take
one server step per round each, so the upper levels are left as HierFAVG.

**Choices and other implementations.** The models are averaged uniformly by default
(``weighting="uniform"``: the paper's ``1/|P|``, as FLGo's, FedLab's and PFLlib's FedDyn);
``weighting="examples"`` averages them by data size and adds ``α Σ_{i∈P} n_i (x − θ_i) / Σ_j n_j``
to ``h`` (the objective ``Σ_i (n_i/n) L_i``). ``alpha_by_data_size=True``
gives client ``i`` the coefficient ``α_i = α · n̄ / n_i`` (``n̄`` the mean examples of its parent's
clients) in its regularizer and its ``∇L_i`` update, the server keeping ``α``: FL-bench's
``alpha / client_weights`` (the data-weighted objective with uniform averaging). FL-bench also
clips the local gradients at ``max_grad_norm`` (10): chain ``optax.clip_by_global_norm`` before the
local optimizer for that (it clips the regularized gradient, as FL-bench does).

Implementations that differ from the paper by an evident bug (fedtree follows the paper):
PFLlib's client (``clientdyn.py``) adds ``(α/2) ‖θ − x‖₂`` (the norm, not its square) and its
server divides the models' sum by the number of clients meant to join (``join_clients``), not by
the number that answered; FedLab's server (``feddyn.py`` at the version read) moves ``h`` by
``Σ_{i∈P} θ_i − x`` (the server model subtracted once instead of ``|P|`` times); FL-bench's client
(``src/client/feddyn.py``, at the versions read) keeps only the linear terms ``α ⟨θ, ∇_i − x⟩``
(the quadratic's ``α θ`` is missing unless the optimizer's weight decay is set to ``α``), and its
server adds each answer's ``θ_i − x`` to the state of the client at that answer's position in the
list, not of the client that sent it. FLGo's FedDyn is the paper's.

Refused by name: a robust (blockwise) aggregator (``h = (1/m) Σ_i ∇L_i``, the invariant that makes
FedDyn's fixed point the global one, holds only when ``h`` moves by the mean of the updates that
moved the clients' ``∇L_i``), personal parameters (the regularizer and ``h`` cover the whole
model), a model with BatchNorm statistics (they are not trained by gradients, so neither ``∇L_i``
nor ``h`` describes them), and a ``server_rule`` of the caller's (FedDyn keeps its own).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative
from fedtree.core.local import (
  ClientData,
  ClientRound,
  ClientUpdate,
  Regularizer,
  SGDCarry,
  make_sgd_step,
  run_local_steps,
)
from fedtree.core.model import Model
from fedtree.core.server_rule import Downlink, Inbox, ServerRule, per_node, zeros_like_stacked


def dynamic() -> Regularizer:
  """FedDyn's ``(α_i/2) ‖θ − x‖² − ⟨∇L_i, θ⟩`` up to a constant, as ``(α_i/2) ‖θ‖² − ⟨b, θ⟩`` with
  ``(b, α_i)`` in the carry's anchor slot, ``b = α_i x + ∇L_i`` formed once per client: its gradient
  ``α_i θ − b = α_i (θ − x) − ∇L_i`` reads one model per step besides ``θ``, not two."""

  def reg(params, slot):
    b, a = slot

    def term(p, bb):
      return 0.5 * jnp.asarray(a, p.dtype) * jnp.sum(jnp.square(p)) - jnp.sum(p * bb.astype(p.dtype))

    return sum(jax.tree.leaves(jax.tree.map(term, params, b)))

  return reg


def feddyn_update(
  model: Model, optimizer: optax.GradientTransformation, *, alpha, batch_size: int, max_steps: int,
  alpha_scale: np.ndarray | None = None, compute_dtype=None,
) -> ClientUpdate:
  """FedDyn's client (see the module docstring): local steps on the dynamically regularized loss
  from the received model, ``∇L_i`` kept as the client's state.

  Args:
    model: the model.
    optimizer: the local optimizer (SGD in the paper).
    alpha: ``α >= 0`` (may be traced).
    batch_size: minibatch size.
    max_steps: static scan length.
    alpha_scale: ``[C]`` client ``i``'s coefficient is ``α · alpha_scale[i]`` (``None``: ``α``).
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  check_nonnegative(alpha=alpha)
  step = make_sgd_step(model, optimizer, dynamic(), compute_dtype=compute_dtype)
  scale = None if alpha_scale is None else jnp.asarray(alpha_scale, jnp.float32)

  def apply(anchor, grad_l, data: ClientData, num_steps, key, rnd: ClientRound):
    a = alpha if scale is None else alpha * scale[rnd.client]
    b = jax.tree.map(lambda x, g: jnp.asarray(a, x.dtype) * x + g, anchor, grad_l)
    carry = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=(b, a))
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    theta = carry.params
    new = jax.tree.map(lambda g, t, x: g - jnp.asarray(a, t.dtype) * (t - x), grad_l, theta, anchor)
    return theta, new, loss, ()

  return ClientUpdate(apply=apply, init_state=zeros_like_stacked, takes_round=True)


def feddyn_server(*, alpha) -> ServerRule:
  """FedDyn's server state ``h`` (zeros at the start, never sent): moved by ``α`` times the
  reporting clients' share of the mean update over all clients, and ``h/α`` (0 where ``α = 0``)
  added to the pseudo-gradient (the new model ``mean θ_i − h/α``)."""
  check_nonnegative(alpha=alpha)

  def receive(inbox: Inbox, h):
    assert inbox.population_weight is not None   # (hierfavg gives it)
    share = inbox.weight_sum / jnp.maximum(inbox.population_weight, 1e-30)
    h = jax.tree.map(jnp.add, h, per_node(alpha * share, inbox.pseudo_gradient))
    positive = jnp.asarray(alpha) > 0
    inverse = jnp.where(positive, 1.0 / jnp.where(positive, alpha, 1.0), 0.0)
    out = jax.tree.map(lambda g, hh: g + hh * inverse.astype(hh.dtype), inbox.pseudo_gradient, h)
    return out, h, {}

  return ServerRule(init=zeros_like_stacked, receive=receive, name="feddyn",
                    down=Downlink(broadcast=lambda h: ()))  # h stays home


def _alpha_scale(host) -> np.ndarray:
  """``n̄_parent / n_i`` for every client (``n̄`` the mean examples of its parent's clients)."""
  data, topology = host["data"], host.get("topology")
  n = np.asarray(data.n_train, np.float64)
  parent = (np.zeros(n.shape[0], np.int64) if topology is None
            else np.asarray(topology.parent(topology.depth), np.int64))
  mean = np.bincount(parent, weights=n) / np.maximum(np.bincount(parent), 1)
  return (mean[parent] / np.maximum(n, 1.0)).astype(np.float32)


@method_over(hierfavg, cannot=(
  cannot("personal", "the dynamic regularizer and h cover the whole model"),
  cannot("blockwise", "h must stay the mean of the clients' ∇L_i, (1/m) Σ_i ∇L_i, which only the mean of "
                      "their updates keeps (each ∇L_i moves by its own update)"),
  cannot("model_state", "gradients do not train it, so neither a client's ∇L_i nor the server's h describes "
                        "it; use a model without BatchNorm (e.g. GroupNorm)"),
))
def feddyn(
  host: Host,
  *,
  alpha: float = 0.01,
  alpha_by_data_size: bool = False,
  weighting: str = "uniform",
  name: str = "feddyn",
) -> FederatedAlgorithm:
  """FedDyn on ``topology`` (default flat): see the module docstring.

  Args:
    alpha: ``α >= 0``, the dynamic regularizer's coefficient (traced: a sweep axis).
    alpha_by_data_size: client ``i``'s coefficient ``α n̄ / n_i`` (FL-bench's), else ``α`` (paper).
    weighting: ``"uniform"`` (paper) or ``"examples"`` weights of the models (and of ``h``'s move).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a negative or non-finite ``α``, a robust aggregator, personal parameters, a model
      with BatchNorm statistics, or a ``server_rule``.

  Example:
    Two rounds of FedDyn over 5 clients, 3 sampled a round:

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, _ = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> alg = feddyn(alpha=0.1, model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=2), cohort_size=3)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> state.server_state["Dense_0"]["kernel"].shape, state.client_state["Dense_0"]["kernel"].shape
    ((1, 8, 3), (5, 8, 3))
  """
  try:
    check_nonnegative(alpha=alpha)
  except ValueError as e:
    raise ValueError(f"{name}: {e} (the dynamic regularizer's coefficient; 0 is FedAvg)") from None
  scale = _alpha_scale(host) if alpha_by_data_size else None

  def objective(s: LocalSetup):
    return feddyn_update(s.model, s.optimizer, alpha=alpha, batch_size=s.batch_size, max_steps=s.max_steps,
                         alpha_scale=scale, compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, server_rule=feddyn_server(alpha=alpha), weighting=weighting,
                 name=name)
