"""The update path (fedtree.core.updates): client transforms, blockwise aggregators and node
transforms between a client's training and its parent's server optimizer, against plain
per-client references; an identity path gives bitwise today's results for every algorithm."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from helpers import ALGORITHM_CASES, count_traces, tier_kw, tiny_mlp_problem, trees_equal
from helpers import small_context as _ctx  # noqa: F401  (also used as test_updates._ctx)
from helpers import with_update_paths as _with_path

from fedtree.algorithms import fedavg, hierfavg
from fedtree.core.local import sgd_client_update
from fedtree.core.sampling import cohort_sampler
from fedtree.core.updates import (
  Aggregator,
  ClientTransform,
  DownTransform,
  NodeTransform,
  UpdatePath,
  UpdateState,
  aggregate_children,
  chain,
  chain_nodes,
  identity,
  init_update_state,
  per_level_paths,
)
from fedtree.experiment import capabilities as sections
from fedtree.experiment import registry


def _norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def counting_identity():
  """Changes no update, but keeps per-client state (rounds reported, summed norms) and reports a
  statistic: the whole client stage is exercised while the numbers must stay bitwise equal."""

  def init(params, n):
    return {"times": jnp.zeros((n,), jnp.int32), "norms": jnp.zeros((n,), jnp.float32)}

  def apply(delta, state, key, ctx):
    n = _norm(delta)
    return delta, {"times": state["times"] + 1, "norms": state["norms"] + n}, {"delta_norm": n}

  return ClientTransform(apply, init, name="counting")


def halve_and_count():
  """Scales every update by 1/2 and counts, per client, how often it reported."""

  def init(params, n):
    return jnp.zeros((n,), jnp.int32)

  def apply(delta, state, key, ctx):
    return jax.tree.map(lambda d: 0.5 * d, delta), state + 1, {"one": jnp.ones(())}

  return ClientTransform(apply, init, name="halve")


@pytest.fixture(scope="module")
def problem():
  data, model, schedule = tiny_mlp_problem()
  update = sgd_client_update(model, optax.sgd(0.1), batch_size=4,
                             max_steps=schedule.max_steps(data.max_train))
  return data, model, schedule, update


def _tier(problem, groups, cohort_size, chunk, **kw):
  data, model, schedule, update = problem
  parent = np.asarray(groups, np.int32)
  num_parents = int(parent.max()) + 1
  sampler = cohort_sampler(parent, cohort_size, chunk_size=chunk)
  start = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_parents,) + a.shape),
                       model.init(jax.random.key(0)))
  cohort = sampler(jax.random.key(1))
  res = tier_kw(update, start, cohort, data, num_steps=schedule.num_steps(data.n_train),
                     weights=data.n_train.astype(jnp.float32), key=jax.random.key(2),
                     chunk_size=sampler.chunk_size, keep_client_params=True,
                     block_size=max(sampler.sizes), **kw)
  return res, start, cohort, sampler


GROUPS = (0, 0, 0, 1, 1)


def test_client_transform_against_a_per_client_loop(problem):
  """Each reported client's delta is halved before weighting; its state counts its reports."""
  data = problem[0]
  plain, start, cohort, _ = _tier(problem, GROUPS, (2, 1), 1)
  path = UpdatePath(client=halve_and_count())
  state = init_update_state(path, jax.tree.map(lambda a: a[0], start), data.num_clients, 2)
  res, *_ = _tier(problem, GROUPS, (2, 1), 1, path=path, update_state=state)
  # the reference: every slot's trained model (same keys: training is unchanged), deltas halved
  w = np.asarray(data.n_train, np.float64)
  clients, parents = np.asarray(cohort.clients), np.asarray(cohort.parent)
  for leaf_s, leaf_p, leaf_r in zip(jax.tree.leaves(start), jax.tree.leaves(plain.client_params),
                                    jax.tree.leaves(res.delta_sum), strict=True):
    want = np.zeros_like(np.asarray(leaf_r, np.float64))
    for slot, (c, g) in enumerate(zip(clients, parents, strict=True)):
      want[g] += w[c] * 0.5 * (np.asarray(leaf_s[g], np.float64) - np.asarray(leaf_p[slot], np.float64))
    np.testing.assert_allclose(np.asarray(leaf_r), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(res.weight_sum), np.asarray(plain.weight_sum))
  counts = np.zeros(data.num_clients, np.int32)
  counts[clients] = 1
  np.testing.assert_array_equal(np.asarray(res.update_state.client), counts)
  assert float(res.update_stats["one"]) == 1.0
  # the kept models are what the clients sent: anchor - halved delta
  for s, p, k in zip(jax.tree.leaves(start), jax.tree.leaves(plain.client_params),
                     jax.tree.leaves(res.client_params), strict=True):
    anchor = np.asarray(s)[parents]
    np.testing.assert_allclose(np.asarray(k), anchor - 0.5 * (anchor - np.asarray(p)), rtol=1e-5, atol=1e-6)


def _block_sum():
  """A blockwise aggregator that returns the plain (unweighted) sum of each parent's valid
  updates and their number: what the blocks hold, checkable against the kept models."""

  def aggregate(block, node_state, key):
    v = block.valid.astype(jnp.float32)
    assert block.clients.shape == block.valid.shape
    total = jax.tree.map(lambda d: jnp.einsum("pk,pk...->p...", v, d), block.deltas)
    return total, jnp.sum(v, axis=1), {"block_slots": jnp.sum(v, axis=1)}

  return Aggregator(aggregate, name="block_sum")


@pytest.mark.parametrize("chunk", [1, 3])
def test_blockwise_aggregator_sees_each_parents_cohort(problem, chunk):
  """Uneven cohorts (3 and 1 of 3 and 2 clients) padded to the chunk: every parent's block holds
  exactly its sampled clients' updates, empty slots masked."""
  plain, start, cohort, sampler = _tier(problem, GROUPS, (3, 1), chunk)
  res, *_ = _tier(problem, GROUPS, (3, 1), chunk, path=UpdatePath(aggregator=_block_sum()))
  clients, parents, valid = map(np.asarray, (cohort.clients, cohort.parent, cohort.valid))
  for leaf_s, leaf_p, leaf_r in zip(jax.tree.leaves(start), jax.tree.leaves(plain.client_params),
                                    jax.tree.leaves(res.delta_sum), strict=True):
    want = np.zeros(np.shape(leaf_r))
    for slot in np.flatnonzero(valid):
      want[parents[slot]] += np.asarray(leaf_s[parents[slot]]) - np.asarray(leaf_p[slot])
    np.testing.assert_allclose(np.asarray(leaf_r), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(res.weight_sum), [3.0, 1.0])
  assert float(res.update_stats["block_slots"]) == 2.0   # mean over the 2 parents of (3, 1)
  del clients


def test_blockwise_aggregator_needs_block_size(problem):
  data, model, schedule, update = problem
  sampler = cohort_sampler(np.zeros(5, np.int32), None)
  start = jax.tree.map(lambda a: a[None], model.init(jax.random.key(0)))
  with pytest.raises(ValueError, match="aggregator 'block_sum' needs every parent's whole cohort"):
    tier_kw(update, start, sampler(jax.random.key(1)), data, num_steps=schedule.num_steps(data.n_train),
                 weights=data.n_train.astype(jnp.float32), key=jax.random.key(2),
                 path=UpdatePath(aggregator=_block_sum()))


def test_node_transform_sees_client_stats_and_keeps_state(problem):
  """A node step adds 1 to every parent's delta sum, fixes the denominator and counts the
  reported clients into its state; client transforms read that state as their parent's."""
  data = problem[0]

  def node_apply(delta_sum, weight_sum, client_stats, state, key):
    seen = state + client_stats["reported"]
    return (jax.tree.map(lambda d: d + 1.0, delta_sum), jnp.full_like(weight_sum, 100.0), seen,
            {"reported_here": client_stats["reported"]})

  def read_parent(delta, state, key, ctx):
    return delta, state, {"parent_seen": ctx.node_state["count"]}

  node = NodeTransform(node_apply, lambda p, n: jnp.zeros((n,), jnp.float32), name="count")
  path = UpdatePath(client=ClientTransform(read_parent, name="read"), node=node)
  plain, start, cohort, _ = _tier(problem, GROUPS, (2, 1), 3)
  state = init_update_state(path, jax.tree.map(lambda a: a[0], start), data.num_clients, 2)
  state = state._replace(node={"count": jnp.asarray([7.0, 9.0])})
  res, *_ = _tier(problem, GROUPS, (2, 1), 3, path=path, update_state=state)
  np.testing.assert_array_equal(np.asarray(res.update_state.node["count"]), [9.0, 10.0])
  np.testing.assert_array_equal(np.asarray(res.weight_sum), [100.0, 100.0])
  for a, b in zip(jax.tree.leaves(res.delta_sum), jax.tree.leaves(plain.delta_sum), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b) + 1.0, rtol=1e-6, atol=1e-6)
  # clients read their parent's count: (7 + 7 + 9) / 3 reported clients
  np.testing.assert_allclose(float(res.update_stats["parent_seen"]), 23.0 / 3.0, rtol=1e-6)
  assert float(res.update_stats["reported_here"]) == 1.5


def test_aggregate_children_identity_is_bitwise_and_blockwise_matches(problem):
  data, model, *_ = problem
  p0 = model.init(jax.random.key(0))
  parents = jax.tree.map(lambda a: jnp.stack([a, 2 * a]), p0)
  children = jax.tree.map(lambda a: jnp.stack([a + 0.1 * i for i in range(5)]), p0)
  owner = np.asarray([1, 0, 1, 0, 0])
  w = jnp.asarray([1.0, 2.0, 3.0, 4.0, 5.0])
  from fedtree.core.aggregation import pseudo_gradient_from_children

  want, total = pseudo_gradient_from_children(parents, children, w, jnp.asarray(owner))
  path = UpdatePath(client=counting_identity())
  st = init_update_state(path, p0, 5, 2)
  got, got_total, new_state, stats = aggregate_children(path, st, parents, children, w, owner,
                                                        jax.random.key(0))
  trees_equal(got, want)
  trees_equal(got_total, total)
  np.testing.assert_array_equal(np.asarray(new_state.client["times"]), np.ones(5))
  assert "delta_norm" in stats

  def wmean(block, node_state, key):
    s = jax.tree.map(lambda d: jnp.einsum("pk,pk...->p...", block.weights, d), block.deltas)
    np.testing.assert_array_equal(np.sort(np.asarray(block.clients[1])), [-1, 0, 2])
    return s, jnp.sum(block.weights, axis=1), {}

  got, got_total, *_ = aggregate_children(UpdatePath(aggregator=Aggregator(wmean, "wmean")), UpdateState(),
                                          parents, children, w, owner, jax.random.key(0))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_chains_compose_in_order_and_refuse_duplicate_names():
  scale = lambda f, name: ClientTransform(lambda d, s, k, c: (d * f, s, {name: d * f}), name=name)
  both = chain(scale(2.0, "a"), None, scale(3.0, "b"))
  ctx = None
  out, state, stats = both.apply(jnp.ones(()), ((), ()), jax.random.key(0), ctx)
  assert float(out) == 6.0 and float(stats["a"]) == 2.0 and float(stats["b"]) == 6.0
  assert chain() is None and chain(None) is None
  with pytest.raises(ValueError, match="two transforms are named 'a'"):
    chain(scale(2.0, "a"), scale(3.0, "a"))
  n = lambda name: NodeTransform(lambda d, w, cs, s, k: (d, w, s, {}), name=name)
  with pytest.raises(ValueError, match="two transforms are named 'x'"):
    chain_nodes(n("x"), n("x"))
  assert chain_nodes(n("x"), n("y")).keyed


def test_per_level_paths_refusals():
  p = UpdatePath(client=identity())
  assert per_level_paths(p, 3, algorithm="a") == (None, None, p)
  assert per_level_paths({-1: p, 0: p}, 2, algorithm="a") == (p, p)
  assert per_level_paths({0: UpdatePath()}, 2, algorithm="a") == (None, None)
  with pytest.raises(ValueError, match="an update path for level 3"):
    per_level_paths({3: p}, 2, algorithm="a")
  with pytest.raises(ValueError, match="pfedmt runs an update path only at server level"):
    per_level_paths({0: p}, 2, algorithm="pfedmt", supported_levels=(1,))
  with pytest.raises(ValueError, match="cfl cannot use aggregator 'block_sum'"):
    per_level_paths(UpdatePath(aggregator=_block_sum()), 1, algorithm="cfl", blockwise=False)
  down = DownTransform(lambda params, key: (params, {}), name="q")
  with pytest.raises(ValueError, match="bhfl cannot run downlink transform 'q'"):
    per_level_paths(UpdatePath(down=down), 1, algorithm="bhfl", down=False)


def test_sections_compose_and_refuse_two_aggregators():
  a = sections.PathParts(client=(identity(),), aggregator=_block_sum())
  b = sections.PathParts(client=(counting_identity(),), aggregator=_block_sum())
  paths = sections.compose({"x": {-1: a}, "y": {0: b}})
  assert set(paths) == {-1, 0} and paths[-1].aggregator.name == "block_sum"
  with pytest.raises(ValueError, match=r"level -1: sections \['x', 'y'\] each set an aggregator"):
    sections.compose({"x": {-1: a}, "y": {-1: b}})
  with pytest.raises(ValueError, match="unknown update-path section 'bogus'"):
    sections.update_paths_from_config({"bogus": {"a": 1}}, None)


# ------------------------------------------------------------------------ every algorithm
def _drop_update_state(state):
  """The state without the update path's own rows (the only leaves a path may add)."""
  if hasattr(state, "inner") and hasattr(state, "base"):   # adapters on a frozen base (FrozenBaseState)
    return state.replace(inner=_drop_update_state(state.inner))
  if hasattr(state, "update_state"):
    return state.replace(update_state=()) if hasattr(state, "replace") else state._replace(update_state=())
  if hasattr(state, "stages"):
    return state.replace(stages=tuple(_drop_update_state(s) for s in state.stages))
  return state


FAST = ("fedavg", "hierfavg", "pfedmt", "bhfl", "cfl")
REFUSE_A_CLIENT_TRANSFORM = ("fedproto", "mime", "hetlora", "depthfl", "fedmd", "fedrolex", "fjord",
                             "heterofl")
"""Methods that refuse a client transform (issues 36, 38, 50 and 51): what their clients send is not the
model delta an update path acts on (FedProto's prototypes, HetLoRA's zero-padded low-rank update, the
masked sub-models of HeteroFL, FjORD, FedRolex and DepthFL, FedMD's logits; the width methods take
differential privacy's stages alone), or travels beside it
unprocessed (Mime's full-batch gradients). pFedHN's Δθ_i, FedAMP's and FedFomo's models (as
updates against what the client received) take one since issue 55."""
KEEP_WHAT_IS_SENT = ("fedamp", "fedfomo", "scaffold", "mimelite")
"""With a client stage FedAMP's and FedFomo's parents keep what each client sent, ``start − (start −
w_i)``, and SCAFFOLD's and MimeLite's messages travel the path with the update (their sum as the
aggregate's mean times the reporters): the same numbers to rounding, not bitwise."""


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ALGORITHM_CASES)])
def test_identity_path_is_bitwise_today_for_every_algorithm(name):
  """A stateful identity client transform (with statistics) changes no number of any algorithm,
  its state counts every client's reports, and the round still compiles once; a method whose
  clients send something a client transform cannot act on (a whole personal model, prototypes,
  gradients beside the update) refuses it by name instead."""
  ctx = _ctx()
  if name in REFUSE_A_CLIENT_TRANSFORM:
    with pytest.raises(ValueError, match=rf"^{name}: .*run (it |{name} )?without"):
      _with_path(ctx, name, UpdatePath(client=counting_identity()))
    return
  plain = _with_path(ctx, name, None)
  path = _with_path(ctx, name, UpdatePath(client=counting_identity()))
  counted, traces = count_traces(path)
  step_a, step_b = jax.jit(plain.round), jax.jit(counted.round)
  sa, sb = plain.init(jax.random.key(0)), path.init(jax.random.key(0))
  for r in range(3):
    k = jax.random.fold_in(jax.random.key(3), r)
    sa, ma = step_a(sa, ctx.data, k)
    sb, mb = step_b(sb, ctx.data, k)
    for key_, v in ma.items():
      if name in KEEP_WHAT_IS_SENT:
        np.testing.assert_allclose(np.asarray(v), np.asarray(mb[key_]), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name}: {key_}")
      else:
        np.testing.assert_array_equal(np.asarray(v), np.asarray(mb[key_]), err_msg=f"{name}: {key_}")
    assert "delta_norm" in mb, f"{name}: the client stage's statistic is not in the metrics"
  assert len(traces) == 1, f"{name}: traced {len(traces)} times"
  if name in ("fedamp", "fedfomo"):   # the parents' copies (a state of the rule's only with a client stage)
    chex.assert_trees_all_close(sa.client_state, sb.client_state, rtol=1e-4, atol=1e-5)
    return
  if name in KEEP_WHAT_IS_SENT:
    chex.assert_trees_all_close(_drop_update_state(sa), _drop_update_state(sb), rtol=1e-4, atol=1e-5)
    return
  trees_equal(_drop_update_state(sa), _drop_update_state(sb))
  leaves = [np.asarray(x) for x in jax.tree.leaves(sb) if np.asarray(x).dtype == np.int32
            and np.asarray(x).shape == (ctx.data.num_clients,)]
  assert any(x.sum() > 0 for x in leaves), f"{name}: the transform's state never counted a report"


def test_identity_paths_at_every_level_of_hierfavg():
  """An identity path at the root and at the edges of a 3-level tree, with the root aggregating
  every 2 rounds: bitwise the plain run; the root's statistics only in its rounds."""
  ctx = _ctx()
  common = registry.factory_kwargs("h", ml_collections.ConfigDict(
    {"algorithm": "hierfavg", "periods": (2,), "chunk_size": 3}), ctx)
  plain = hierfavg(**common)
  path = hierfavg(**common, update_paths={0: UpdatePath(client=counting_identity()),
                                          1: UpdatePath(client=counting_identity())})
  sa, sb = plain.init(jax.random.key(0)), path.init(jax.random.key(0))
  for r in range(2):
    k = jax.random.fold_in(jax.random.key(3), r)
    sa, _ = jax.jit(plain.round)(sa, ctx.data, k)
    sb, mb = jax.jit(path.round)(sb, ctx.data, k)
    assert (float(mb["level0_delta_norm"]) > 0) == (r == 1)
  trees_equal(_drop_update_state(sa), _drop_update_state(sb))
  np.testing.assert_array_equal(np.asarray(sb.update_state[0].client["times"]), [1, 1])


def test_downlink_transform_changes_what_clients_receive():
  """A downlink that zeroes the model: clients start from zeros, the server applies their mean
  pseudo-gradient (zeros - trained) to its own model."""
  ctx = _ctx()
  kw = registry.factory_kwargs("f", ml_collections.ConfigDict({"algorithm": "fedavg", "chunk_size": 3}), ctx)
  zero = DownTransform(lambda p, key: (jax.tree.map(jnp.zeros_like, p), {"sent": jnp.ones(1)}), name="zero")
  alg = fedavg(**kw, update_paths=UpdatePath(down=zero))
  ref = fedavg(**kw, init_params=jax.tree.map(jnp.zeros_like, ctx.model.init(jax.random.key(0))))
  s0 = alg.init(jax.random.key(0))
  s1, m = jax.jit(alg.round)(s0, ctx.data, jax.random.key(5))
  r1, _ = jax.jit(ref.round)(ref.init(jax.random.key(0)), ctx.data, jax.random.key(5))
  # same training from zeros: the deltas equal, applied to s0's model instead of zeros
  for a, b, p0 in zip(jax.tree.leaves(s1.params[0]), jax.tree.leaves(r1.params[0]),
                      jax.tree.leaves(s0.params[0]), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b) + np.asarray(p0), rtol=1e-5, atol=1e-6)
  assert float(m["downlink_sent"]) == 1.0
