"""pFedMT: personalized multi-tier FL with Moreau envelopes (paper 003, Algorithm 1; Umeå).

The state (``PFedMTState``) and the method (:func:`pfedmt`). The round, the choices and the options
that reproduce the authors' code: :doc:`the pFedMT page <algorithms/pfedmt.md#options>`.

References:
  Paper 003 (Umeå), Algorithm 1 and eq. (4).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedtree.core.algorithm import (
  CLIENT_ROWS,
  UNNAMED,
  FederatedAlgorithm,
  NodeModels,
  RowName,
  check_weighting,
  client_weights,
  initial_params,
  path_rows,
)
from fedtree.core.checks import is_traced
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule, stack
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import CohortSampler, cohort_sampler
from fedtree.core.tier import Clients, Down, Tier, edge_metrics, train_cohort
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath, init_update_state, per_level_paths
from fedtree.objectives.moreau import moreau_client_update

TEAM_WEIGHTINGS = ("examples", "devices", "uniform")


@struct.dataclass
class PFedMTState:
  """State of pFedMT.

  Attributes:
    round: ``int32[]`` global iterations done.
    params: the global model ``x`` (one model pytree, no node axis).
    team_params: ``[M, ...]`` team models ``w_i`` after the last team iteration.
    client_state: ``[C, ...]`` personalized device models ``θ_ij`` (PM), or the state of a
      custom ``client_update``.
    cursor: ``int32[C]`` batch cursors under ``batch_order="cyclic"`` (else ``()``).
    update_state: the :class:`~fedtree.core.updates.UpdateState` of the devices -> teams update
      path (empty without one).
  """

  round: jax.Array
  params: object
  team_params: object
  client_state: object
  cursor: object = ()
  update_state: Any = ()

  def row_names(self) -> PFedMTState:
    """Rows: the teams (``team_params``), the devices (client state, cursors)."""
    return self.replace(round=UNNAMED, params=RowName("row", "the global model"),
                        team_params=RowName("team"), client_state=CLIENT_ROWS, cursor=CLIENT_ROWS,
                        update_state=path_rows(self.update_state, CLIENT_ROWS, RowName("team")))


def pfedmt(
  *,
  model: Model,
  topology: Topology,
  data: FederatedData,
  schedule: LocalSchedule,
  learning_rate: float = 0.01,
  lam: float = 15.0,
  gamma: float = 0.1,
  eta: float = 0.03,
  beta: float = 1.0,
  team_iters: int = 30,
  weighting: str = "examples",
  chunk_size: int | str | None = "auto",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: Any = None,
  name: str = "pfedmt",
  device_lam: float | None = None,
  cohort_size: int | None = None,
  team_weighting: str | None = None,
  skip_nonfinite: bool = False,
  update_paths: UpdatePath | Any = None,
) -> FederatedAlgorithm:
  """pFedMT on a root → teams → devices ``topology`` (depth 2).

  Args:
    model: the model of every device, team and the server.
    topology: root → teams (level 1) → devices (clients).
    data: the federated data (static shapes, validation).
    schedule: the device's local steps ``L`` (``steps=L``), minibatch size and batch order.
    learning_rate: the device step ``α``.
    lam: ``λ``, device-to-team Moreau regularization (the team update's, and by default the
      device step's).
    gamma: ``γ``, team-to-global Moreau regularization.
    eta: ``η``, the team learning rate.
    beta: ``β``, the global learning rate.
    team_iters: ``K`` team iterations per global round.
    weighting: ``"examples"`` (paper) or ``"uniform"`` (authors' code) for ``δ`` (and ``τ``
      unless ``team_weighting`` is given).
    chunk_size: devices trained at once (memory bound); ``None``: all; ``"auto"``: the
      per-backend default.
    compute_dtype: mixed-precision device steps (``None``: the params' dtype).
    client_update: override the device step (default :func:`fedtree.objectives.moreau.moreau_client_update`);
      its ``init_state``, when given, builds the device state (the personalized models are its
      ``personal_models(state)``, else its ``.personal`` field).
    init_params: the model to start from (default ``model.init(key)``).
    name: label for reports.
    device_lam: ``λ_d``, the device step's proximal coefficient (default ``lam``).
    cohort_size: devices sampled per team at every team iteration (``None``: all).
    team_weighting: ``τ``: ``"examples"``, ``"devices"`` or ``"uniform"`` (``1/M``).
    skip_nonfinite: a device whose update is not finite is left out of its team iteration as
      if not sampled (weight 0 in ``δ``, its personal model unchanged; it still counts in
      ``τ``, which is fixed by the data); the ``clients_skipped`` metric counts the device
      updates skipped over the round's ``K`` team iterations (see
      :func:`fedtree.core.tier.train_cohort`).
    update_paths: the update path of the devices' updates into their team models at every
      team iteration (:mod:`fedtree.core.updates`; level 1, or one ``UpdatePath``); its
      statistics are averaged over the team iterations. A path at level 0 is refused: the
      global model mixes the team models by ``τ``, it aggregates no updates.

  Raises:
    ValueError: a tree that is not two tiers deep, or out-of-range hyperparameters.

  Example:
    2 teams (the groups) of 3 and 2 devices, 2 team iterations per global round:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=2))
    >>> alg = pfedmt(topology=Topology.from_labels(groups), team_iters=2, **common)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...'global'...]
  """
  data.validate(topology)
  device_lam = lam if device_lam is None else device_lam
  team_weighting = _check(topology, team_iters, lam, gamma, eta, beta, device_lam, weighting, team_weighting)
  # The devices' updates reach their team through the path of level 1 at every team iteration;
  # the global model mixes the team models by τ, not by aggregating updates (no path at level 0).
  path = per_level_paths(update_paths, 2, algorithm=name, supported_levels=(1,))[1]
  sampler = cohort_sampler(topology.parent(2), cohort_size, chunk_size=chunk_size)
  if client_update is None:
    client_update = moreau_client_update(
      model, learning_rate=learning_rate, lam=device_lam, batch_size=schedule.batch_size,
      max_steps=schedule.max_steps(data.max_train), compute_dtype=compute_dtype,
    )
  elif compute_dtype is not None:
    raise ValueError(
      f"compute_dtype={compute_dtype!r} configures pFedMT's default device step; with an explicit "
      f"client_update, pass compute_dtype to the objective's factory instead"
    )
  tier = Tier(client_update, path=path, chunk_size=sampler.chunk_size, parent_aligned=sampler.parent_aligned,
              batch_order=schedule.batch_order, batch_size=schedule.batch_size, skip_nonfinite=skip_nonfinite,
              block_size=max(sampler.sizes))
  plan = _Plan(model=model, topology=topology, schedule=schedule, sampler=sampler, tier=tier,
               team_iters=int(team_iters), lam=lam, gamma=gamma, eta=eta, beta=beta, weighting=weighting,
               team_weighting=team_weighting, init_params=init_params)
  return FederatedAlgorithm(init=functools.partial(_init, plan), round=functools.partial(_round, plan),
                            models=functools.partial(_models, plan), name=name)


def _check(topology: Topology, team_iters, lam, gamma, eta, beta, device_lam, weighting,
           team_weighting) -> str:
  """Refuses what pFedMT cannot run; returns the team weighting (default: as ``weighting``)."""
  if topology.depth != 2:
    raise ValueError(
      f"pFedMT needs a root -> teams -> devices tree (depth 2), got depth {topology.depth} "
      f"({topology!r}); use config.topology.kind='groups' with team labels"
    )
  if int(team_iters) < 1:
    raise ValueError(f"team_iters (K)={team_iters} must be >= 1")
  for nm, v in (("lam", lam), ("gamma", gamma), ("eta", eta), ("beta", beta),
                ("device_lam", device_lam)):
    if not is_traced(v) and v < 0:
      raise ValueError(f"pFedMT {nm}={v} must be >= 0")
  check_weighting(weighting)
  if team_weighting is None:
    team_weighting = "examples" if weighting == "examples" else "devices"
  if team_weighting not in TEAM_WEIGHTINGS:
    raise ValueError(f"pFedMT team_weighting={team_weighting!r}; choose one of {TEAM_WEIGHTINGS}")
  return team_weighting


@dataclasses.dataclass(frozen=True)
class _Plan:
  """pFedMT's fixed pieces, checked once by :func:`pfedmt`."""

  model: Model
  topology: Topology
  schedule: LocalSchedule
  sampler: CohortSampler
  tier: Tier
  team_iters: int
  lam: Any
  gamma: Any
  eta: Any
  beta: Any
  weighting: str
  team_weighting: str
  init_params: Any

  @property
  def num_teams(self) -> int:
    return self.topology.num_nodes(1)


def _init(plan: _Plan, key) -> PFedMTState:
  update, c = plan.tier.update, plan.topology.num_clients
  x = initial_params(plan.model, key, plan.init_params)
  client_state = update.init_state(x, c) if update.init_state is not None else stack(x, c)
  return PFedMTState(round=jnp.zeros((), jnp.int32), params=x, team_params=stack(x, plan.num_teams),
                     client_state=client_state, cursor=plan.schedule.init_cursor(c),
                     update_state=init_update_state(plan.tier.path, x, c, plan.num_teams))


def _team_weights(plan: _Plan, data: FederatedData, x) -> jax.Array:
  """``τ``: every team's share of the global model (its examples, devices, or uniform)."""
  tau = jax.ops.segment_sum(
    client_weights(data.n_train, "uniform" if plan.team_weighting == "devices" else "examples"),
    jnp.asarray(plan.topology.parent(2)), num_segments=plan.num_teams,
  )
  if plan.team_weighting == "uniform":
    tau = jnp.ones_like(tau)
  tau = tau.astype(jnp.result_type(jnp.float32, *jax.tree.leaves(x)))  # float64 state: float64 τ
  return tau / jnp.sum(tau)


def _team_iteration(plan: _Plan, x, data, num_steps, w_dev, cohort_key, train_key, carry, k):
  """One of the ``K`` team iterations: the sampled devices train, every team model moves."""
  w, pm, cursor, update_state = carry
  eta, lam, gamma = plan.eta, plan.lam, plan.gamma
  res = train_cohort(plan.tier, Down(w), plan.sampler(jax.random.fold_in(cohort_key, k)), data,
                     Clients(num_steps, w_dev, state=pm, cursor=cursor, update_state=update_state),
                     jax.random.fold_in(train_key, k))
  # θ̄_i = w_i - (w_i - Σ_j δ_j θ_ij): the cohort's mean pseudo-gradient, undone.
  theta_bar = jax.tree.map(jnp.subtract, w, res.pseudo_gradient())
  w = jax.tree.map(
    lambda wi, xi, tb: (1.0 - eta * lam - eta * gamma) * wi + eta * gamma * xi[None] + eta * lam * tb,
    w, x, theta_bar,
  )
  return ((w, res.client_state, res.cursor, res.update_state),
          (res.mean_loss(), jnp.asarray(res.num_skipped), res.num_trained, res.update_stats))


def _round(plan: _Plan, state: PFedMTState, data: FederatedData, key):
  x, num_teams = state.params, plan.num_teams
  tau = _team_weights(plan, data, x)
  iteration = functools.partial(_team_iteration, plan, x, data, plan.schedule.num_steps(data.n_train),
                                client_weights(data.n_train, plan.weighting), stream(key, "cohort"),
                                stream(key, "train"))
  (w, pm, cursor, update_state), (losses, skipped, trained, update_stats) = jax.lax.scan(
    iteration, (stack(x, num_teams), state.client_state, state.cursor, state.update_state),
    jnp.arange(plan.team_iters))
  w_bar = jax.tree.map(lambda wi: jnp.tensordot(tau, wi, axes=1), w)
  x = jax.tree.map(lambda xi, wb: (1.0 - plan.beta * plan.gamma) * xi + plan.beta * plan.gamma * wb, x, w_bar)
  metrics = {"train_loss": jnp.mean(losses), "last_team_iter_loss": losses[-1],
             "clients_trained": jnp.sum(trained),   # round trips over the team iterations (bytes)
             **{k: jnp.mean(v) for k, v in update_stats.items()},   # over the team iterations
             # every team sends w_i to the global server and restarts from x (toolbox.traffic)
             "level0_children_sent": jnp.asarray(num_teams, jnp.int32)}
  if plan.tier.skip_nonfinite:
    metrics["clients_skipped"] = jnp.sum(skipped)
  metrics.update(edge_metrics("clients", jnp.sum(trained) + jnp.sum(skipped)))   # (toolbox.traffic)
  metrics.update(edge_metrics("level0", num_teams))
  return PFedMTState(round=state.round + 1, params=x, team_params=w, client_state=pm, cursor=cursor,
                     update_state=update_state), metrics


def _models(plan: _Plan, state: PFedMTState):
  c, update = plan.topology.num_clients, plan.tier.update
  out = {
    "global": NodeModels(jax.tree.map(lambda p: p[None], state.params), np.zeros(c, np.int32)),
    "team": NodeModels(state.team_params, plan.topology.ancestor(1)),
  }
  personal = state.client_state
  if update.personal_models is not None:
    personal = update.personal_models(personal)
  elif update.init_state is not None:
    personal = getattr(personal, "personal", None)
  if personal is not None:
    out["personal"] = NodeModels(personal, np.arange(c, dtype=np.int32))
  return out
