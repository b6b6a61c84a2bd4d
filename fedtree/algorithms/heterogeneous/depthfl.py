"""DepthFL (Kim, Shin, Lee and Moon 2023) on any tree: clients of different depths in one vmapped tier, an
exit classifier after every block, mutual self-distillation among a client's exits, and every block
averaged over the clients holding it (:doc:`the page <algorithms/heterogeneous.md#depthfl>`).

References:
  Kim, Shin, Lee and Moon, DepthFL: Depthwise federated learning for heterogeneous clients, ICLR 2023.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.heterogeneous.heterofl import (
  HOLDERS,
  PATH_REFUSALS,
  capacity_levels,
  holders_rule,
  parents_models,
  parents_rows,
  private_holders,
  private_width,
  sized_systems,
)
from fedtree.algorithms.heterogeneous.width import check_rates, width_plan
from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import ClientModels, FederatedAlgorithm, LocalSetup, ScoredModels
from fedtree.core.local import ClientUpdate, SGDCarry, loss_step, run_local_steps
from fedtree.core.model import Model, masked_loss

REFUSALS = PATH_REFUSALS + (
  cannot("personal", "every block is averaged over its holders; run it without personal"),
  cannot("model_state", "the exits' forward pass has no BatchNorm; use a model without BatchNorm"),
)


def exit_forward(params, x, depth: int):
  """The logits of the first ``depth`` exits ``[depth, B, K]`` of the MLP in ``params["body"]`` (``Dense_0``
  .. ``Dense_L``, ReLU between) with the exit heads ``params["exits"]["Exit_i"]`` after hidden layer ``i``
  (the last exit is the MLP's own output layer)."""
  body, heads = params["body"], params["exits"]
  layers = len(body)
  h = x.reshape((x.shape[0], -1))
  out = []
  for i in range(min(depth, layers)):
    h = h @ body[f"Dense_{i}"]["kernel"] + body[f"Dense_{i}"]["bias"][None, :]
    if i == layers - 1:
      out.append(h)
      break
    h = jax.nn.relu(h)
    out.append(h @ heads[f"Exit_{i}"]["kernel"] + heads[f"Exit_{i}"]["bias"][None, :])
  return jnp.stack(out)


def exit_model(model: Model, blocks: int) -> Model:
  """``model`` (an MLP of ``blocks - 1`` hidden layers) with an exit head after every hidden layer:
  ``params = {"body", "exits", "ensemble"}``, and the prediction the mean of the exits' logits weighted by
  ``params["ensemble"]`` (``[blocks]``, fixed: ones for the ensemble, one-hot for one exit; never trained)."""
  def init(key):
    k_body, k_heads = jax.random.split(key)
    body = model.init(k_body)
    heads = {}
    for i in range(blocks - 1):
      width = body[f"Dense_{i}"]["kernel"].shape[-1]
      kernel = jax.nn.initializers.lecun_normal()(jax.random.fold_in(k_heads, i), (width, model.num_classes))
      heads[f"Exit_{i}"] = {"kernel": kernel.astype(body[f"Dense_{i}"]["kernel"].dtype),
                            "bias": jnp.zeros((model.num_classes,), body[f"Dense_{i}"]["bias"].dtype)}
    return {"body": body, "exits": heads, "ensemble": jnp.ones((blocks,), body["Dense_0"]["bias"].dtype)}

  def apply(params, x, *args, **kwargs):
    logits = exit_forward(params, x, blocks)
    w = jax.lax.stop_gradient(params["ensemble"]).astype(logits.dtype)
    return jnp.einsum("e,ebk->bk", w, logits) / jnp.sum(w)

  return model._replace(init=init, apply=apply)


def depth_mask(template, depth, blocks: int):
  """``float`` masks shaped as the exit model's parameters: the first ``depth`` blocks and exits."""
  def leaf(path, p):
    names = [str(getattr(k, "key", k)) for k in path]
    if names[0] == "ensemble":
      return jnp.zeros(np.shape(p), jnp.result_type(p))
    index = int(names[1].split("_")[1])
    return jnp.broadcast_to(index < depth, np.shape(p)).astype(jnp.result_type(p))
  return jax.tree_util.tree_map_with_path(leaf, template)


def depthfl_update(setup: LocalSetup, blocks: int, levels: np.ndarray, depths: np.ndarray, *,
                   distill: bool, temperature: float) -> ClientUpdate:
  """A DepthFL client of depth ``d``: the host's optimizer and schedule on the sum over its ``d`` exits of
  the cross-entropy and, with ``distill``, of the mean KL divergence from each other exit's (fixed) soft
  predictions (mutual self-distillation); it sends its first ``d`` blocks and exits, and their mask as
  its message."""
  depth_of = jnp.asarray(depths[levels], jnp.int32)

  def apply(anchor, state, data, num_steps, key, rnd):
    depth = depth_of[rnd.client]
    on = jnp.arange(blocks) < depth   # the client's exits

    def loss_fn(params, batch, rng):
      logits = exit_forward(params, batch.x, blocks)   # [E, B, K]; exits past the depth are masked out
      ce = jax.vmap(lambda z: masked_loss(setup.model, z, batch.y, batch.mask))(logits)
      total = jnp.sum(jnp.where(on, ce, 0.0))
      if distill:
        log_p = jax.nn.log_softmax(logits / temperature)
        teach = jax.lax.stop_gradient(jnp.exp(log_p))
        real = batch.mask.astype(log_p.dtype)
        # kl[i, j]: the mean over the batch's rows of KL(exit j's predictions || exit i's)
        kl = jnp.einsum("jbk,jbk,b->j", teach, jax.lax.stop_gradient(log_p), real)[None, :] - jnp.einsum(
          "jbk,ibk,b->ij", teach, log_p, real)
        kl = kl / jnp.maximum(jnp.sum(real), 1.0)
        pair = on[:, None] & on[None, :] & ~jnp.eye(blocks, dtype=bool)
        others = jnp.maximum(depth - 1, 1).astype(kl.dtype)
        total = total + temperature ** 2 * jnp.sum(jnp.where(pair, kl, 0.0)) / others
      return total, jnp.sum(jnp.where(on, ce, 0.0))

    carry = SGDCarry(params=anchor, opt_state=setup.optimizer.init(anchor), anchor=anchor)
    carry, loss = run_local_steps(loss_step(loss_fn, setup.optimizer), carry, data, num_steps, key,
                                  batch_size=setup.batch_size, max_steps=setup.max_steps)
    mask = depth_mask(anchor, depth, blocks)
    params = jax.tree.map(lambda a, p, m: a + (p - a) * m, anchor, carry.params, mask)
    return params, state, loss, jax.tree.map(lambda m: rnd.weight.astype(m.dtype) * m, mask)

  return ClientUpdate(apply=apply, takes_round=True, message_bytes=0)


@method_over(hierfavg, cannot=REFUSALS, sets={"server_rule": HOLDERS})
def depthfl(host: Host, *, depths: Sequence[int] | None = None, proportions: Sequence[float] | None = None,
            capacity_seed: int = 0, capacities: str = "seeded", distill: bool = True,
            temperature: float = 1.0, name: str = "depthfl") -> FederatedAlgorithm:
  """DepthFL: a client of depth ``d`` trains the MLP's first ``d`` blocks (a hidden layer each, the last
  block the output layer) and an exit classifier after each, on the sum of its exits' cross-entropies and,
  with ``distill``, their mutual self-distillation; every block and exit is averaged over the clients
  holding it. The global prediction is the mean of every exit's logits (the paper's ensemble).

  The run's ``model`` must be an ``mlp`` (``Dense_0 .. Dense_L``); the method adds an exit head after
  every hidden layer. Models: ``global`` (the ensemble of all exits), ``depth_1`` .. ``depth_L`` (each
  exit alone) and ``own_depth`` (each client the ensemble of the exits it trains). Bytes: the population's
  mean of the clients' blocks and exits; under ``systems`` a client computes at its blocks' share of the
  multiply-adds. Not built: the paper's ResNet blocks with bottleneck exits (the blocks here are an
  MLP's layers).

  Args:
    depths: the capacity levels' depths, each in ``1 .. L+1`` (default every depth).
    proportions: the share of clients at each depth (``None``: equal), summing to 1.
    capacity_seed: the seed that places the levels on the clients (fixed for the run).
    capacities: ``"seeded"`` or ``"speed"`` (by the devices' speeds: the fastest clients the deepest), as
      HeteroFL's.
    distill: mutual self-distillation among a client's exits (the paper's; ``False``: the exits'
      cross-entropies alone).
    temperature: the softmax temperature of the distillation (scaled by its square; the paper's 1).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a model that is not an MLP with a hidden layer, a depth outside ``1 .. L+1``, proportions
      that are not one per depth summing to 1, an update path beyond differential privacy's clipping and
      central noise (as the width methods'), personal parameters or BatchNorm.

  Example:
    >>> mlp = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8, 6))
    >>> alg = depthfl(model=mlp, data=data, local_optimizer=optax.sgd(0.1),
    ...               schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['depth_1', 'depth_2', 'depth_3', 'global', 'own_depth']
  """
  model = host["model"]
  template = jax.eval_shape(model.init, jax.random.key(0))
  plan = width_plan(template, name)
  if any(not lay.name.startswith("Dense_") for lay in plan.layers):
    raise ValueError(f"{name} needs an mlp model (Dense layers alone); this one has "
                     f"{[lay.name for lay in plan.layers]}")
  blocks = len(plan.layers)
  depths = np.arange(1, blocks + 1) if depths is None else np.asarray(depths, np.int64).ravel()
  distinct = len(set(depths.tolist())) == depths.size
  if depths.size == 0 or depths.min() < 1 or depths.max() > blocks or not distinct:
    raise ValueError(f"{name}: depths={depths.tolist()} must be distinct block counts in 1..{blocks} (the "
                     f"model's {blocks - 1} hidden layers and its output layer)")
  _, share = check_rates(depths / blocks, proportions, name)
  levels = capacity_levels(host, share, depths, capacity_seed, capacities, name, ("seeded", "speed"))
  assert levels is not None   # (fixed: DepthFL's exits are scored at each client's own depth)
  wrapped = exit_model(model, blocks)
  full = jax.eval_shape(wrapped.init, jax.random.key(0))
  if host.get("init_params") is not None:   # the model's start, its exit heads drawn from capacity_seed
    start = {**wrapped.init(jax.random.key(capacity_seed)), "body": host["init_params"]}
    host = host.replace(init_params=start)
  itemsize = jnp.dtype(full["body"]["Dense_0"]["kernel"].dtype).itemsize
  level_params = np.asarray([_parameters(full, d, blocks) for d in depths], np.float64)
  level_bytes = level_params * itemsize
  macs = np.asarray([_macs(plan, d) for d in depths], np.float64)
  mean_bytes = int(round(float(level_bytes[levels].mean())))
  if host.get("systems") is not None:
    host = host.replace(systems=sized_systems(host["systems"], macs[levels] / _macs(plan, blocks),
                                              level_bytes[levels]))
  holders = None
  if private_width(host, name, label_split=False):   # a client holds its first blocks and their exits
    masks = jax.tree.map(lambda *m: jnp.stack(m), *[depth_mask(full, int(d), blocks) for d in depths])
    host, holders = private_holders(host, name, levels, masks)
  rule = holders_rule(name, mean_bytes, holders=holders)

  def objective(s: LocalSetup) -> ClientUpdate:
    return depthfl_update(s, blocks, levels, depths, distill=distill, temperature=float(temperature))

  alg = host.replace(model=wrapped).build(client_update=objective, server_rule=rule, name=name)

  host_sets = alg.client_sets()

  def scored(made):   # scored by the model with exits (ScoredModels), not the run's MLP
    return {k: ScoredModels(params=v.params, model_of_client=v.model_of_client, model=wrapped)
            for k, v in made.items()}

  def own_depth(state, clients):   # every client's (clients None) or those clients' own depth
    rows, ids = parents_rows(host_sets.nodes(state), clients, levels.size)
    own = (jnp.arange(blocks)[None, :] < jnp.take(jnp.asarray(depths[levels]), ids)[:, None])
    return ScoredModels(params={**rows, "ensemble": own.astype(rows["ensemble"].dtype)},
                        model_of_client=np.arange(ids.shape[0], dtype=np.int32), model=wrapped)

  def nodes(state):
    out = scored(host_sets.nodes(state))
    top = parents_models(out)
    for d in range(1, blocks + 1):
      one = jax.nn.one_hot(d - 1, blocks, dtype=top.params["ensemble"].dtype)
      weights = jnp.broadcast_to(one, top.params["ensemble"].shape)
      out[f"depth_{d}"] = ScoredModels(params={**top.params, "ensemble": weights},
                                       model_of_client=top.model_of_client, model=wrapped)
    return out

  def sets(state, clients):
    return {**scored(host_sets.sets(state, clients)), "own_depth": own_depth(state, clients)}

  def models(state):
    return {**nodes(state), **sets(state, None)}

  return alg._replace(models=models, client_models=ClientModels(models, sets, nodes))


def _parameters(full, depth: int, blocks: int) -> int:
  """Parameters of a client of ``depth``: its blocks and their exits."""
  total = 0
  for i in range(depth):
    total += sum(int(np.prod(a.shape)) for a in jax.tree.leaves(full["body"][f"Dense_{i}"]))
    if i < blocks - 1:
      total += sum(int(np.prod(a.shape)) for a in jax.tree.leaves(full["exits"][f"Exit_{i}"]))
  return total


def _macs(plan, depth: int) -> int:
  """Multiply-adds of the first ``depth`` blocks' kernels (the exits' small heads apart)."""
  return sum(lay.fan_in * lay.width for lay in plan.layers[:depth])
