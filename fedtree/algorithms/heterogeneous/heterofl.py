"""HeteroFL (Diao et al. 2021) and FedRolex (Alam et al. 2022) on any tree: clients of different widths
in one vmapped tier, every sub-model a mask over the full model's shapes, every coordinate averaged over
the clients holding it (:doc:`the page <algorithms/heterogeneous.md>`).

References:
  Diao, Ding and Tarokh, HeteroFL: Computation and communication efficient federated learning for
  heterogeneous clients, ICLR 2021.
  Alam, Liu, Yan and Zhang, FedRolex: Model-heterogeneous federated learning with rolling sub-model
  extraction, NeurIPS 2022.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.heterogeneous.width import (
  WidthPlan,
  check_rates,
  client_classes,
  client_levels,
  level_name,
  width_plan,
)
from fedtree.algorithms.host import COMPOSITIONS, Host, cannot, hierfavg, method_over
from fedtree.algorithms.host.refusals import clients_path, tree_depth
from fedtree.core.algorithm import ClientModels, FederatedAlgorithm, LocalSetup, NodeModels, ObjectiveFactory
from fedtree.core.local import (
  ClientUpdate,
  SGDCarry,
  cast_floating,
  check_compute_dtype,
  counting,
  loss_step,
  mean_over_trained,
  run_local_steps,
  run_update,
  sgd_client_update,
)
from fedtree.core.model import Model, masked_kl, masked_loss, token_mask
from fedtree.core.server_rule import Downlink, Inbox, ServerRule, Uplink
from fedtree.core.updates import per_level_paths
from fedtree.toolbox.privacy import private_stages
from fedtree.toolbox.systems import Systems

HELD = "over coordinates the client never held"
PATH_REFUSALS = (
  cannot("client_coding", f"a compressor, an attack or secure aggregation's encoding would rewrite the "
                          f"full-shaped update, {HELD}; run it without them (differential privacy's clipping "
                          f"runs)"),
  cannot("node_coding", f"it would act on the parents' sums {HELD}; run it without (differential "
                        f"privacy's central noise runs)"),
  cannot("blockwise", "a robust aggregator would compare a holder's value with the zeros of the clients "
                      "that never held the coordinate"),
  cannot("down_transform", "a compressed downlink would send the full-shaped model, not the client's "
                           "sub-model; run it without"),
  cannot("upper_paths", "the holders' means rescale a client's part of a coordinate by its parent's clients "
                        "over the coordinate's holders, so a level above would sum more than its noise "
                        "covers; add the noise at the clients' parents"),
)
"""The update paths a sub-model method refuses: differential privacy's clipping and noise run (local noise
kept on the coordinates a client holds: :func:`private_holders`)."""
REFUSALS = PATH_REFUSALS + (
  cannot("personal", "every parameter is sliced by width and averaged over its holders; run it without "
                     "personal"),
  cannot("model_state", "HeteroFL's static batch normalization is not built; use a model without "
                        "BatchNorm (norm='none')"),
)

PyTree = Any
HOLDERS = "the clients' parents average each coordinate over the clients holding it"


def masked_model(model: Model, factors) -> Model:
  """``model`` computing with its parameters times ``factors`` (a sub-model's mask and scaler): the
  gradient outside the mask is exactly zero."""
  def apply(params, *args, **kwargs):
    return model.apply(jax.tree.map(jnp.multiply, params, factors), *args, **kwargs)
  return model._replace(apply=apply)


def width_update(setup: LocalSetup, given: ObjectiveFactory | None, plan: WidthPlan,
                 levels: np.ndarray | None, rates: np.ndarray, *, mode: str, scaler: bool, algorithm: str,
                 classes: np.ndarray | None = None, distill: tuple[float, float] | None = None,
                 shares: np.ndarray | None = None) -> ClientUpdate:
  """The local objective (``given``, default plain SGD) run by every client on its sub-model (``mode``:
  ``"static"``, the first channels; ``"rolling"``, FedRolex's window; ``"ordered"``, FjORD's width
  drawn every step up to the client's own, :func:`ordered_model`); with ``classes`` (``bool[C, K]``)
  the output layer is cut to each client's classes too (HeteroFL's ``label_split``); with ``distill``
  (``(α, T)``, ``"ordered"`` only) every step is FjORD's self-distillation (:func:`distilled_update`).
  Its state is ``(rounds trained int32[C], the objective's state)``; its message, ``weight × mask``, tells the
  parent who holds each coordinate (free on the wire: the parent knows its clients' levels). With
  ``levels`` ``None`` a client's level is drawn every round from ``shares`` (:func:`drawn_level`, HeteroFL's
  dynamic mode) and its state is ``(rounds trained, (level of its last round int32[C], the objective's
  state))``.

  Raises:
    ValueError: an objective that starts from the client's own model or sends a message of its own.
  """
  def build(model: Model) -> ClientUpdate:
    if given is None:
      return sgd_client_update(model, setup.optimizer, batch_size=setup.batch_size, max_steps=setup.max_steps,
                               compute_dtype=setup.compute_dtype)
    return given(setup._replace(model=model))

  probe = build(setup.model)
  if probe.starts_from_own_model or probe.takes_round:
    does = ("trains from each client's own model" if probe.starts_from_own_model
            else "sends a message of its own")
    raise ValueError(f"{algorithm}: the local objective {does}, "
                     f"which a width sub-model cannot carry; use one that starts from the parent's model "
                     f"(plain SGD, FedProx)")
  level_of, kept, rate_of = tables(plan, levels, rates)
  order = jnp.asarray(np.argsort(rates, kind="stable"))   # the levels by rate, narrowest first
  allowed = jnp.asarray([int(np.sum(rates <= r)) for r in rates], jnp.int32)   # levels at most each one

  def step(anchor, own, data, num_steps, key, rnd):
    if level_of is None:   # (the level of this round, kept beside the objective's state)
      level, (_, own) = drawn_level(key, shares), own
    else:
      level = level_of[rnd.client]
    offset = rnd.broadcast if mode == "rolling" else 0
    labels = None if classes is None else jnp.asarray(classes)[rnd.client]
    mask, factors = plan.factors(anchor, kept[level], rate_of[level], offset=offset, scaler=scaler,
                                 classes=labels)
    if distill is not None:
      update = distilled_update(setup, plan, anchor, kept[order], allowed[level], *distill)
    else:
      model = (ordered_model(setup.model, plan, anchor, kept[order], allowed[level]) if mode == "ordered"
               else masked_model(setup.model, factors))
      update = build(model)
    params, own, loss, _ = run_update(update, anchor, own, data, num_steps, key, rnd)
    params = jax.tree.map(lambda a, p, m: a + (p - a) * m, anchor, params, mask)
    message = jax.tree.map(lambda m: rnd.weight.astype(m.dtype) * m, mask)
    return params, own if levels is not None else (level, own), loss, message

  if levels is not None:
    return counting(probe, step)._replace(message_bytes=0)
  inner = probe.init_state

  def init_state(params, num_clients):   # (every client's level of its last round, the objective's)
    return (jnp.zeros((num_clients,), jnp.int32), () if inner is None else inner(params, num_clients))

  drawn = probe._replace(init_state=init_state,
                         personal_models=None if probe.personal_models is None else
                         (lambda state: probe.personal_models(state[1])))   # type: ignore[misc]
  return counting(drawn, step)._replace(message_bytes=0)


LEVEL_DRAW = 0x6c76
"""Folded into a client's key of the round to draw its level (HeteroFL's dynamic mode); its training keeps
the key as it is."""


def drawn_level(key, shares) -> jax.Array:
  """A client's level for the round, drawn from its key with probabilities ``shares`` (HeteroFL's
  ``model_split_mode='dynamic'``: every round every client's capacity is drawn anew)."""
  return jax.random.choice(jax.random.fold_in(key, LEVEL_DRAW), len(shares), p=jnp.asarray(shares)).astype(
    jnp.int32)


ORDERED_DRAW = 0x6f64
"""Folded into a training step's PRNG key to draw FjORD's width (the model's own uses, dropout, keep the
key as it is)."""


def ordered_width(rng, allowed):
  """The index, among the levels sorted by rate, of a training step's width: uniform over the first
  ``allowed`` (FjORD's ``p ~ U(D_P)`` up to the client's ``p_max``)."""
  return jax.random.randint(jax.random.fold_in(rng, ORDERED_DRAW), (), 0, allowed)


def ordered_model(model: Model, plan: WidthPlan, template, kept, allowed) -> Model:
  """``model`` computing, in every training step, with the sub-model of a width drawn from the step's
  key (:func:`ordered_width` over the rows of ``kept``, the levels' kept channels narrowest first), and
  outside training with the widest it allows (FjORD's ordered dropout)."""
  def apply(params, x, *args, train: bool = False, rng=None, **kwargs):
    index = ordered_width(rng, allowed) if train and rng is not None else allowed - 1
    mask = plan.masks(template, kept[index])
    return model.apply(jax.tree.map(jnp.multiply, params, mask), x, *args, train=train, rng=rng, **kwargs)
  return model._replace(apply=apply)


def distilled_update(setup: LocalSetup, plan: WidthPlan, template, kept, allowed, weight: float,
                     temperature: float) -> ClientUpdate:
  """FjORD's local steps with self-distillation (Sec. 3.3): every step trains the client's widest
  sub-model (the teacher, ``p_max``: the ``allowed``-th row of ``kept``) on the labels and a width drawn
  up to it (:func:`ordered_width`, the student) on ``(1 − α) CE + α T² KL(sg(teacher) ‖ student)`` at
  temperature ``T``; one step of the host's optimizer on the sum, from the parent's model. The loss
  reported is the drawn width's cross-entropy, as without distillation."""
  model, optimizer, dtype = setup.model, setup.optimizer, check_compute_dtype(setup.compute_dtype)
  wide = plan.masks(template, kept[allowed - 1])

  def loss_fn(params, batch, rng):
    narrow = plan.masks(template, kept[ordered_width(rng, allowed)])
    x = cast_floating(batch.x, dtype)
    teacher, student = (model.apply(cast_floating(jax.tree.map(jnp.multiply, params, m), dtype), x,
                                    train=True, rng=rng) for m in (wide, narrow))
    hard, soft = (masked_loss(model, z, batch.y, batch.mask) for z in (teacher, student))
    kl = masked_kl(jax.lax.stop_gradient(teacher), student, token_mask(batch.y, batch.mask), temperature)
    return hard + (1.0 - weight) * soft + weight * temperature ** 2 * kl, soft

  def apply(anchor, state, data, num_steps, key):
    carry = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=anchor)
    carry, loss = run_local_steps(loss_step(loss_fn, optimizer), carry, data, num_steps, key,
                                  batch_size=setup.batch_size, max_steps=setup.max_steps)
    return carry.params, state, loss

  return ClientUpdate(apply=apply)


CAPACITIES = ("seeded", "speed", "dynamic")


def capacity_levels(host: Host, share: np.ndarray, sizes: np.ndarray, seed: int, capacities: str,
                    name: str, allowed: tuple[str, ...] = CAPACITIES) -> np.ndarray | None:
  """Every client's level (:func:`~fedtree.algorithms.heterogeneous.width.client_levels`): ``"seeded"``,
  a seeded placement; ``"speed"``, by the speed of the client's device in the run's ``systems`` profile
  (the fastest clients the largest sub-models); ``"dynamic"``: none, a client's level is drawn every round
  (:func:`drawn_level`).

  Raises:
    ValueError: a ``capacities`` not in ``allowed``, ``"speed"`` without ``systems``, or ``"dynamic"`` with
      them (the clock sizes each client's sub-model once for the run).
  """
  if capacities not in allowed:
    raise ValueError(f"{name}: capacities={capacities!r}; choose one of {allowed}")
  num_clients = int(host["data"].num_clients)
  if capacities == "seeded":
    return client_levels(share, num_clients, seed)
  if capacities == "dynamic":
    if host.get("systems") is not None:
      raise ValueError(f"{name}: capacities='dynamic' with systems: the clock runs each client at the cost "
                       f"of one sub-model for the whole run; use capacities='seeded' or 'speed' with systems")
    return None
  if host.get("systems") is None:
    raise ValueError(f"{name}: capacities='speed' places the levels by the devices' speeds: give systems= "
                     f"(a run's systems section, e.g. FedScale's device traces), or capacities='seeded'")
  return client_levels(share, num_clients, seed, sizes=sizes, speed=np.asarray(host["systems"].profile.speed))


def tables(plan: WidthPlan, levels: np.ndarray | None, rates: np.ndarray):
  """Device tables: every client's level ``int32[C]`` (``None`` where the levels are drawn every round),
  every level's kept channels ``int32[L, layers]`` and its rate ``[L]``."""
  level_of = None if levels is None else jnp.asarray(levels)
  return (level_of, jnp.asarray([plan.kept(r) for r in rates], jnp.int32),
          jnp.asarray(rates, jnp.result_type(float)))   # float64 under x64


def sized_systems(systems: Systems, share: np.ndarray, sizes: np.ndarray) -> Systems:
  """``systems`` for clients of sub-models: a client's steps per second divided by its sub-model's share
  of the full model's multiply-adds (``share [C]``, e.g. :meth:`~fedtree.algorithms.heterogeneous.width.
  WidthPlan.compute_share`), and its bytes each way its sub-model's (``sizes [C]``, where ``systems``
  does not set them)."""
  dtype = systems.profile.speed.dtype
  profile = systems.profile._replace(speed=systems.profile.speed / jnp.asarray(share, dtype))
  sizes = jnp.asarray(sizes, dtype)
  return dataclasses.replace(
    systems, profile=profile,
    uplink_bytes=sizes if systems.uplink_bytes is None else systems.uplink_bytes,
    downlink_bytes=sizes if systems.downlink_bytes is None else systems.downlink_bytes)


def _over_holders(pseudo_gradient, total, held):
  """Each coordinate of ``pseudo_gradient`` (a mean over ``total [P]``) rescaled to a mean over ``held``
  (``[P, ...]`` per coordinate); 0 where none holds it."""
  def one(g, h):
    t = total.reshape((-1,) + (1,) * (g.ndim - 1)).astype(g.dtype)
    return jnp.where(h > 0, g * t / jnp.where(h > 0, h, 1), 0)
  return jax.tree.map(one, pseudo_gradient, held)


def holders_mean(inbox: Inbox, state):
  """The parent's pseudo-gradient averaged per coordinate over the clients that hold it (the host's
  mean over all reporting clients, rescaled by the share of their weight that holds the coordinate;
  0 where none does); ``state``, the rounds so far, counts one more."""
  return _over_holders(inbox.pseudo_gradient, inbox.weight_sum, inbox.messages), state + 1, {}


def expected_holders_mean(holders: Callable[[jax.Array], PyTree]):
  """Under differential privacy: the parent's pseudo-gradient (its noised sum over its normalizer)
  rescaled per coordinate by the parent's clients over the coordinate's holders among them
  (``holders(rounds) -> [P, ...]``, public: the levels are fixed), so the sum is divided by the
  coordinate's expected reporting holders: post-processing of the Gaussian mechanism, where dividing
  by the holders that reported would reveal them."""
  def receive(inbox: Inbox, state):
    return _over_holders(inbox.pseudo_gradient, inbox.population, holders(state)), state + 1, {}
  return receive


def holders_rule(name: str, mean_bytes: int, *, send_rounds: bool = False,
                 holders: Callable[[jax.Array], PyTree] | None = None) -> ServerRule:
  """The parents' rule of the sub-model methods: :func:`holders_mean` (with ``holders``, the
  population's: :func:`expected_holders_mean`), its state the rounds so far (sent to the clients with
  ``send_rounds``: FedRolex's window), ``mean_bytes`` each way per client."""
  receive = holders_mean if holders is None else expected_holders_mean(holders)
  return ServerRule(init=lambda params, n: jnp.zeros((n,), jnp.int32), receive=receive, name=name,
                    down=Downlink(broadcast=(lambda rounds: rounds) if send_rounds else (lambda rounds: ()),
                                  bytes=lambda _: mean_bytes),
                    up=Uplink(bytes=lambda _: mean_bytes), moves=True)


def parents_models(models: dict):
  """The model set of the clients' parents among a host's ``models`` (the deepest level that
  aggregates)."""
  return models[[k for k in models if k == "global" or k.startswith("level")][-1]]


def parents_rows(models: dict, clients, num_clients: int):
  """``(rows, ids)``: the model of each client's parent (:func:`parents_models`), a row for every client
  (``clients`` ``None``) or for the clients ``clients``, and those clients' ids."""
  top = parents_models(models)
  ids = np.arange(num_clients) if clients is None else jnp.asarray(clients)
  moc = jnp.take(jnp.asarray(top.model_of_client), ids)
  return jax.tree.map(lambda a: jnp.take(a, moc, axis=0), top.params), ids


def private_width(host: Host, name: str, label_split: bool) -> bool:
  """Whether differential privacy's stages run at the clients' tier (the declared refusals leave its
  clipping and its noise, central or local, only); refused with them: ``label_split`` and a moving
  membership."""
  if not private_stages(clients_path(host, name)):
    return False
  if label_split:
    raise ValueError(f"{name}: differential privacy with label_split=True: each client's output layer is cut "
                     f"to the classes of its data, which its mask reveals; run it with label_split=False")
  if host.get("membership") is not None:
    raise ValueError(f"{name}: differential privacy with a membership: the holders' means divide by the "
                     f"holders of the fixed tree; run it on a fixed tree")
  return True


def private_holders(host: Host, name: str, levels: np.ndarray | None, masks: PyTree,
                    moving: Callable[[jax.Array], PyTree] | None = None,
                    shares: np.ndarray | None = None) -> tuple[Host, Callable]:
  """Under differential privacy, the host whose clients' local noise (if any) stays on the coordinates
  each client's level holds (``masks``, ``[L, ...]``: every level's), and ``holders(rounds) -> [P, ...]``:
  how many of each parent's clients hold every coordinate, each level's mask times its clients under the
  parent (``levels`` ``None``: levels drawn every round with probabilities ``shares``, so each parent's
  clients times each level's share, the expected holders). ``moving(rounds) -> [L, ...]``: masks that
  change every round (FedRolex's windows; its local noise is refused by name)."""
  topology, depth = host.get("topology"), tree_depth(host)
  num_clients = int(host["data"].num_clients)
  parent = np.zeros(num_clients, np.int64) if topology is None else np.asarray(topology.parent(depth))
  parents = 1 if topology is None else topology.num_nodes(depth - 1)
  counts = np.zeros((parents, jax.tree.leaves(masks)[0].shape[0]))
  if levels is None:
    assert shares is not None
    counts += np.bincount(parent, minlength=parents)[:, None] * np.asarray(shares, np.float64)[None, :]
  else:
    np.add.at(counts, (parent, levels), 1.0)

  def holders(rounds):
    at = masks if moving is None else moving(rounds)
    return jax.tree.map(lambda m: jnp.einsum("pl,l...->p...", jnp.asarray(counts, m.dtype), m), at)

  if moving is None and COMPOSITIONS["local_noise"].present(host):
    level_of = jnp.asarray(levels)
    paths = list(per_level_paths(host["update_paths"], depth, algorithm=name))
    stage = paths[-1].client

    def apply(delta, state, key, ctx):   # the noise never lands where the client trained nothing
      out, state, stats = stage.apply(delta, state, key, ctx)
      return jax.tree.map(lambda o, m: o * m[level_of[ctx.client]], out, masks), state, stats

    paths[-1] = paths[-1]._replace(client=stage._replace(apply=apply))
    host = host.replace(update_paths=tuple(paths))
  return host, holders


def width_method(host: Host, *, rates, proportions, capacity_seed, mode, scaler, client_update, name,
                 per_level: bool = True, label_split: bool = False, capacities: str = "seeded",
                 distill: tuple[float, float] | None = None) -> FederatedAlgorithm:
  """The method of width sub-models on ``host`` (:func:`width_update`'s ``mode``), its bytes, and its
  models: every level's sub-model and each client's own when ``per_level``."""
  model, data = host["model"], host["data"]
  template = host.get("init_params")
  if template is None:
    template = jax.eval_shape(model.init, jax.random.key(0))
  if isinstance(client_update, ClientUpdate):
    raise ValueError(f"{name}: client_update is a built ClientUpdate, whose model {name} cannot slice; give "
                     f"an objective factory (setup -> ClientUpdate), as fedprox's")
  plan = width_plan(template, name)
  rate, share = check_rates(rates, proportions, name)
  levels = capacity_levels(host, share, rate, capacity_seed, capacities, name)
  dynamic = levels is None
  itemsize = max(jnp.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(template))
  level_bytes = np.asarray([plan.parameters(r) * itemsize for r in rate], np.float64)
  mean_bytes = int(round(float(share @ level_bytes if dynamic else level_bytes[levels].mean())))
  if host.get("systems") is not None:
    assert levels is not None   # (capacity_levels refuses dynamic draws under systems)
    shares = np.asarray([plan.compute_share(r) for r in rate])
    share = shares[levels]
    if distill is not None:   # a step runs the widest sub-model and a width drawn up to it
      share = share + np.asarray([shares[rate <= r].mean() for r in rate])[levels]
    host = host.replace(systems=sized_systems(host["systems"], share, level_bytes[levels]))
  holders = None
  if private_width(host, name, label_split):
    kept_of = jnp.asarray([plan.kept(r) for r in rate], jnp.int32)

    def level_masks(offset):
      return jax.vmap(lambda k: plan.masks(template, k, offset=offset))(kept_of)

    moving = (lambda rounds: level_masks(rounds[0])) if mode == "rolling" else None
    if dynamic and COMPOSITIONS["local_noise"].present(host):
      raise ValueError(f"{name}: local noise with capacities='dynamic': a client's level is drawn in its "
                       f"round, beyond what its privacy stage sees, so its noise would land on coordinates "
                       f"it never held; use central noise (privacy.mechanism='central') or fixed capacities")
    host, holders = private_holders(host, name, levels, level_masks(0), moving, share)
  rule = holders_rule(name, mean_bytes, send_rounds=mode == "rolling", holders=holders)

  def objective(s: LocalSetup) -> ClientUpdate:
    return width_update(s, client_update, plan, levels, rate, mode=mode, scaler=scaler, algorithm=name,
                        classes=client_classes(data, name) if label_split else None, distill=distill,
                        shares=share if dynamic else None)

  alg = host.build(client_update=objective, server_rule=rule, name=name)
  _, kept, rate_of = tables(plan, levels, rate)

  def round_fn(state, data, key):
    new, metrics = alg.round(state, data, key)
    if dynamic:   # each trained client's sub-model of the round (its level kept in its state's rows)
      drawn = jnp.take(jnp.asarray(level_bytes), new.client_state[1][0])
      size = mean_over_trained(state.client_state, new.client_state, drawn)
    else:
      size = mean_over_trained(state.client_state, new.client_state, level_bytes[levels], data.window)
    return new, {**metrics, "uplink_bytes": size, "downlink_bytes": size}

  def sub_model(params, level):   # the sub-model of a level, as it trained (with its scaler)
    _, factors = plan.factors(template, kept[level], rate_of[level], scaler=scaler)
    return jax.tree.map(jnp.multiply, params, factors)

  def own_width(state, clients):   # every client's (clients None) or those clients' own sub-model
    rows, ids = parents_rows(host_sets.nodes(state), clients, levels.size)
    return NodeModels(jax.vmap(sub_model)(rows, jnp.take(jnp.asarray(levels), ids)),
                      np.arange(ids.shape[0], dtype=np.int32))

  host_sets = alg.client_sets()

  def nodes(state):
    out = dict(host_sets.nodes(state))
    if per_level:
      top = parents_models(out)
      for level, r in enumerate(rate):
        sub = jax.vmap(sub_model, (0, None))(top.params, level)
        out[level_name(r)] = NodeModels(sub, top.model_of_client)
    return out

  def sets(state, clients):   # (a client has no width of its own when its level is drawn every round)
    own = {"own_width": own_width(state, clients)} if per_level and not dynamic else {}
    return {**host_sets.sets(state, clients), **own}

  def models(state):
    return {**nodes(state), **sets(state, None)}

  return alg._replace(round=round_fn, models=models, client_models=ClientModels(models, sets, nodes))


@method_over(hierfavg, cannot=REFUSALS, sets={"server_rule": HOLDERS})
def heterofl(host: Host, *, rates: Sequence[float] = (1.0, 0.5, 0.25, 0.125, 0.0625),
             proportions: Sequence[float] | None = None, capacity_seed: int = 0, scaler: bool = True,
             label_split: bool = False, capacities: str = "seeded",
             client_update: ObjectiveFactory | None = None, name: str = "heterofl") -> FederatedAlgorithm:
  """HeteroFL: static width slices of every layer, averaged per coordinate over the clients holding it.

  Every client has a capacity level fixed for the run; it trains the first ``ceil(r · n)`` channels of
  every layer (``r`` its level's rate), its outputs divided by ``r`` in training (the scaler). Models:
  ``global``, every level's sub-model (``width_1``, ``width_1_2``, ...) and each client's own
  (``own_width``); ``uplink_bytes``/``downlink_bytes``: the sampled clients' mean sub-model; under
  ``systems`` each client computes and transfers at its sub-model's cost (:func:`sized_systems`). HeteroFL's
  code averages by count: ``weighting="uniform"``. Not built: static batch normalization.

  Args:
    rates: the capacity levels' width rates, each in (0, 1] (HeteroFL's a-e: 1, 1/2, 1/4, 1/8, 1/16).
    proportions: the share of clients at each level (``None``: equal), summing to 1.
    capacity_seed: the seed that places the levels on the clients (fixed for the run).
    capacities: ``"seeded"`` (that placement), ``"speed"``: by the speed of each client's device in the
      run's ``systems`` profile (FedScale's device traces, say), the fastest clients the widest, or
      ``"dynamic"``: every sampled client's level drawn anew every round with probabilities
      ``proportions`` (HeteroFL's ``model_split_mode='dynamic'``; no ``own_width`` model then, and the
      byte columns count each round's drawn sub-models).
    scaler: divide every sliced layer's output by the rate in training (HeteroFL's scaler module).
    label_split: cut the output layer to the classes in each client's training rows too (HeteroFL's
      code's masked cross-entropy: the other classes' logits are 0 and get no gradient, and each
      class's output weights are averaged over the clients holding it).
    client_update: the local objective as a factory (default plain SGD; e.g. FedProx's), run on the
      client's sub-model.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a rate outside (0, 1], proportions that are not one per rate summing to 1, a model whose
      layers cannot be sliced (named), an update path beyond differential privacy's clipping and central
      noise at the clients' parents (:doc:`docs
      <algorithms/heterogeneous.md#differential-privacy-on-sub-models>`), personal parameters or BatchNorm.

  Example:
    Five clients at widths 1 and 1/2 of an MLP with a hidden layer of 8:

    >>> mlp = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = heterofl(model=mlp, data=data, rates=(1.0, 0.5), local_optimizer=optax.sgd(0.1),
    ...                schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'own_width', 'width_1', 'width_1_2']
  """
  return width_method(host, rates=rates, proportions=proportions, capacity_seed=capacity_seed, mode="static",
                      scaler=scaler, client_update=client_update, name=name, label_split=label_split,
                      capacities=capacities)


@method_over(hierfavg, cannot=REFUSALS + (
  cannot("local_noise", "a client's window moves every round, beyond what its stage sees, so its noise would "
                        "land on coordinates it never held; use central noise (privacy.mechanism='central')"),
), sets={"server_rule": HOLDERS})
def fedrolex(host: Host, *, rates: Sequence[float] = (1.0, 0.5, 0.25, 0.125, 0.0625),
             proportions: Sequence[float] | None = None, capacity_seed: int = 0, scaler: bool = True,
             label_split: bool = False, capacities: str = "seeded",
             client_update: ObjectiveFactory | None = None, name: str = "fedrolex") -> FederatedAlgorithm:
  """FedRolex: HeteroFL with every client's channel window rolling by one channel a round (round ``t``'s
  window starts at channel ``t mod n`` of every layer of ``n`` channels), so every channel is trained.

  Args: as :func:`heterofl`'s. Only the global model is scored (the paper's evaluation).

  Example:
    >>> mlp = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedrolex(model=mlp, data=data, rates=(1.0, 0.25), local_optimizer=optax.sgd(0.1),
    ...                schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=3, key=jax.random.key(0))
    >>> int(state.server_state[0])   # the window's offset: one channel a round
    3
  """
  return width_method(host, rates=rates, proportions=proportions, capacity_seed=capacity_seed, mode="rolling",
                      scaler=scaler, client_update=client_update, name=name, per_level=False,
                      label_split=label_split, capacities=capacities)
