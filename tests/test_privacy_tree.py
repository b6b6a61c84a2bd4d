"""Hierarchical DP on a 3-level tree (root -> edge servers -> clients) from the config's
``privacy.noise_level``, and Poisson sampling wired into HierFAVG / FedAvg.

Noise at the root (trusted edge servers) against a plain numpy reference of the two
aggregations; the noise's std at the root and at the edges against the derived sensitivity;
the refusals of what the derivation does not cover; Poisson inclusion frequencies; the accounting
with Poisson's ``q``."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from test_privacy import _children, _np_clip

from fedtree.core.updates import aggregate_children, init_update_state
from fedtree.experiment import registry
from fedtree.experiment.capabilities import privacy as xp
from fedtree.experiment.registry import run_context

dp_accounting = pytest.importorskip("dp_accounting")


def _ctx(hidden=(4,)):
  import test_updates as tu

  from fedtree.models import build_model

  ctx = tu._ctx()   # root -> 2 edge servers -> 3 clients each
  if hidden != (4,):
    model = build_model("mlp", example_shape=ctx.data.example_shape, num_classes=3, hidden=hidden)
    ctx = dataclasses.replace(ctx, model=model)
  return ctx


def _run(privacy, **extra):
  return ml_collections.ConfigDict({"algorithm": "hierfavg", "chunk_size": 3, "weighting": "uniform",
                                    "cohort_size": 2, "privacy": privacy, **extra})


def _paths(ctx, privacy, **extra):
  return registry.factory_kwargs("dp", _run(privacy, **extra), ctx)["update_paths"]


# ------------------------------------------------------------------------ noise above the edges
def test_noise_at_the_root_against_a_plain_reference():
  """The config's paths, applied as HierFAVG applies them (edges: sgd(1.0) on the clipped mean;
  root: the N_e-weighted mean of the edges' models), equal the numpy reference
  ``Σ_e N_e mean_i clip(δ_i) / N`` plus noise of std ``z C s / N``, ``s = 2 max_e N_e / k_e``
  (replace-one; cohorts of 2 of 3: s = 3); the edges add none."""
  ctx = _ctx()
  c, z = 0.5, 0.7
  paths = _paths(ctx, {"clip_norm": c, "noise_multiplier": z, "noise_level": 0})
  assert set(paths) == {-1, 0}
  assert paths[-1].client.name == "dp_clip" and paths[-1].node is None and paths[0].node.name == "dp"
  parents, kids, owner = _children(num=6, shape=(30, 20))   # 2 edges, 3 clients each (N_e = 3)
  w = jnp.ones(6, jnp.float32)

  def level(path, par, chi, weights, own, key):
    st = init_update_state(path, jax.tree.map(lambda a: a[0], par), len(own), par["w"].shape[0])
    return aggregate_children(path, st, par, chi, weights, own, jax.random.key(key))

  root = jax.tree.map(lambda a: a[:1], parents)
  edges = jax.tree.map(lambda a: jnp.stack([a[0], a[0]]), parents)   # the root's model, sent down
  d_edge, _, _, m_edge = level(paths[-1], edges, kids, w, owner, 0)
  assert "dp_noise_std" not in m_edge
  edge_models = jax.tree.map(jnp.subtract, edges, d_edge)
  d_root, total, _, m_root = level(paths[0], root, edge_models, jnp.full(2, 3.0), np.zeros(2, np.int32), 1)
  s = 2 * 3 / 2
  assert float(m_root["dp_noise_std"]) == pytest.approx(z * c * s)
  assert float(total[0]) == 6.0
  ref = {k: np.zeros(parents[k].shape[1:]) for k in kids}
  for e in range(2):
    members = [i for i in range(6) if owner[i] == e]
    clipped = [_np_clip({k: parents[k][0] - kids[k][i] for k in kids}, c, False) for i in members]
    for k in kids:
      ref[k] += 3 * np.mean([d[k] for d in clipped], axis=0) / 6
  noise = np.concatenate([(np.asarray(d_root[k][0]) - ref[k]).ravel() for k in kids])
  n = noise.size   # 620 coordinates: the std within 5 standard errors of a sample of n
  sd = z * c * s / 6
  assert abs(noise.std() / sd - 1) < 5 / math.sqrt(2 * n) and abs(noise.mean()) < 5 * sd / math.sqrt(n)
  z0 = _paths(ctx, {"clip_norm": c, "noise_multiplier": 0.0, "noise_level": 0})
  d0, *_ = level(z0[0], root, edge_models, jnp.full(2, 3.0), np.zeros(2, np.int32), 1)
  for k in kids:
    np.testing.assert_allclose(np.asarray(d0[k][0]), ref[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("noise_level", [0, pytest.param(-1, marks=pytest.mark.slow)])
def test_hierfavg_round_noise_at_the_root_vs_the_edges(noise_level):
  """One HierFAVG round of the 3-level tree from the config: the global model's noise (the round
  with z minus the round with z = 0, same key) has the std the sensitivity gives: at the root
  ``z C s / N`` (s = 2 N_e / k_e), at every edge ``2 z C / k_e`` weighted ``N_e / N``, i.e.
  ``sqrt(E)`` times larger for E equal edges."""
  ctx = _ctx(hidden=(48,))
  common = registry.factory_kwargs("h", ml_collections.ConfigDict(
    {"algorithm": "hierfavg", "chunk_size": 3, "weighting": "uniform", "cohort_size": 2}), ctx)
  c, z = 0.5, 1.5
  from fedtree.algorithms import hierfavg

  def one(zz):
    paths = _paths(ctx, {"clip_norm": c, "noise_multiplier": zz, "noise_level": noise_level})
    alg = hierfavg(**common, update_paths=paths)
    return jax.jit(alg.round)(alg.init(jax.random.key(0)), ctx.data, jax.random.key(4))

  (s0, m0), (s1, m1) = one(0.0), one(z)
  np.testing.assert_array_equal(np.asarray(m0["train_loss"]), np.asarray(m1["train_loss"]))
  noise = np.concatenate([np.asarray(a - b).ravel() for a, b in zip(jax.tree.leaves(s1.params[0]),
                                                                    jax.tree.leaves(s0.params[0]),
                                                                    strict=True)])
  if noise_level == 0:
    sd = z * c * (2 * 3 / 2) / 6
    assert float(m1["level0_dp_noise_std"]) == pytest.approx(z * c * 3)
    assert "dp_noise_std" not in m1
  else:
    sd = math.sqrt(2 * (3 / 6 * 2 * z * c / 2) ** 2)
    assert float(m1["dp_noise_std"]) == pytest.approx(2 * z * c)
    assert "level0_dp_noise_std" not in m1
  n = noise.size
  assert n > 300
  assert abs(noise.std() / sd - 1) < 5 / math.sqrt(2 * n)


def test_noise_above_the_edges_refuses_what_it_cannot_bound():
  ctx = _ctx()
  base = {"clip_norm": 0.5, "noise_multiplier": 1.0, "noise_level": 0}
  with pytest.raises(ValueError, match=r"periods=\(2,\): level 0 aggregates every 2 rounds.*unbounded"):
    _paths(ctx, base, periods=(2,))
  with pytest.raises(ValueError, match=r"\{'name': 'fedavgm'\} at level 1.*sgd\(learning_rate=1.0\)"):
    _paths(ctx, base, server={"name": "fedavgm"})
  with pytest.raises(ValueError, match=r"server optimizer .*'learning_rate': 0.5.* at level 1"):
    _paths(ctx, base, servers=[{"name": "fedavg"}, {"name": "sgd", "learning_rate": 0.5}])
  # the root's own optimizer is post-processing: any
  _paths(ctx, base, servers=[{"name": "adam", "learning_rate": 0.1}, {"name": "fedavg"}])
  with pytest.raises(ValueError, match=r"noise_level=0 with mechanism='local'"):
    _paths(ctx, {**base, "mechanism": "local"})
  with pytest.raises(ValueError, match=r"noise_level=0 with adaptive clipping"):
    _paths(ctx, {**base, "adaptive": {"initial_clip": 0.1}})
  with pytest.raises(ValueError, match=r"noise_level=2; choose a server level of this 2-level tree"):
    _paths(ctx, {**base, "noise_level": 2})
  run = ml_collections.ConfigDict({"algorithm": "pfedmt", "weighting": "uniform", "privacy": base})
  with pytest.raises(ValueError, match=r"noise_level=0 with algorithm='pfedmt'"):
    xp.plan(base, run_context(ctx, "x", run), verbose=False)
  # (IFCA is one server over every client: its level 0 is the clients' parent, where any algorithm
  # adds noise; this asserted a refusal on the config's 2-level tree, which IFCA is not built on)
  run = ml_collections.ConfigDict({"algorithm": "ifca", "weighting": "uniform", "privacy": base})
  p = xp.plan(base, run_context(ctx, "x", run), verbose=False)
  assert (p.depth, p.noise_level) == (1, 0)
  # noise at the edges: their servers and periods are post-processing, nothing refused
  _paths(ctx, {**base, "noise_level": -1}, periods=(2,), server={"name": "fedavgm"})


def test_accounting_of_noise_at_the_root_equals_the_edges():
  """One client is in one edge's cohort: the root's release is a sampled Gaussian over that
  edge's clients with the multiplier z (the noise is z times the sensitivity), so ε is the same
  as with noise at every edge (parallel composition)."""
  ctx = _ctx()
  p0 = xp.plan({"clip_norm": 0.5, "noise_multiplier": 1.3, "noise_level": 0},
               run_context(ctx, "dp", _run({})), verbose=False)
  p1 = xp.plan({"clip_norm": 0.5, "noise_multiplier": 1.3},
               run_context(ctx, "dp", _run({})), verbose=False)
  assert p0.sensitivity == pytest.approx(3.0) and p0.noise_level == 0 and p1.noise_level == 1
  assert xp.epsilon_after(p0, 4) == xp.epsilon_after(p1, 4) > 0


# ------------------------------------------------------------------------ Poisson sampling
def test_poisson_sampling_in_hierfavg_inclusion_frequency():
  """``sampling="poisson"``: HierFAVG's sampler takes every client with probability q (400 seeded
  rounds, within 5 binomial standard errors), the valid slots hold distinct clients; the options
  are checked by name."""
  from fedtree.algorithms import hierfavg
  from fedtree.algorithms.host.sampler import build_sampler
  from fedtree.core.rng import stream

  ctx = _ctx()
  q = 0.4
  sampler = build_sampler(ctx.topology.parent(ctx.topology.depth), sampling="poisson", cohort_size=None,
                          poisson_q=q, chunk_size=3)
  draw = jax.jit(jax.vmap(lambda k: sampler(stream(k, "cohort"))))
  n = 400
  d = draw(jax.random.split(jax.random.key(0), n))
  c, v = np.asarray(d.clients), np.asarray(d.valid)
  hits = np.zeros(6)
  for i in range(n):
    assert len(set(c[i][v[i]].tolist())) == int(v[i].sum())
    np.add.at(hits, c[i][v[i]], 1)
  assert np.all(np.abs(hits / n - q) < 5 * math.sqrt(q * (1 - q) / n))
  kw = registry.factory_kwargs("p", _poisson_run(q), ctx)
  with pytest.raises(ValueError, match=r"sampling='poisson' needs poisson_q"):
    hierfavg(**{**kw, "poisson_q": None})
  with pytest.raises(ValueError, match=r"poisson_q=0.4 is only read with sampling='poisson'"):
    hierfavg(**{**kw, "sampling": "uniform"})
  with pytest.raises(ValueError, match=r"sampling='random'; choose one of"):
    hierfavg(**{**kw, "sampling": "random"})
  with pytest.raises(ValueError, match=r"q=1.5"):
    hierfavg(**{**kw, "poisson_q": 1.5})


def _poisson_run(q, **extra):
  return ml_collections.ConfigDict({"algorithm": "hierfavg", "chunk_size": 3, "weighting": "uniform",
                                    "sampling": "poisson", "poisson_q": q, **extra})


@pytest.mark.slow
def test_poisson_rounds_train_the_sampled_clients_and_refuse_an_overflow(monkeypatch):
  """Rounds of HierFAVG with Poisson sampling from the config run (finite); one slot per edge of 3
  clients at q = 0.4 (overflow 0.35 per round) is refused before anything compiles, naming
  cohort_size (issue 40); admitted anyway (the check's threshold raised), a draw of two clients stops
  the run with an error naming q, the slot count and cohort_size (a host callback inside the jitted
  round), never a silent truncation."""
  import sys

  from fedtree.algorithms import hierfavg

  ctx = _ctx()
  alg = hierfavg(**registry.factory_kwargs("p", _poisson_run(0.4), ctx))
  s, step = alg.init(jax.random.key(0)), jax.jit(alg.round)
  for r in range(3):
    s, _ = step(s, ctx.data, jax.random.key(r))
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(s.params))
  with pytest.raises(ValueError, match=r"cohort_size=1 with sampling='poisson', poisson_q=0.4: parent 0's 3 "
                                       r"clients overflow its 1 slots with probability 0.352"):
    hierfavg(**registry.factory_kwargs("p", _poisson_run(0.4, cohort_size=1), ctx))
  monkeypatch.setattr(sys.modules["fedtree.algorithms.host.sampler"], "POISSON_OVERFLOW", 1.0)
  small = hierfavg(**registry.factory_kwargs("p", _poisson_run(0.4, cohort_size=1), ctx))
  st, step = small.init(jax.random.key(0)), jax.jit(small.round)
  with pytest.raises(Exception, match=r"q=0.4 drew \d clients under parent \d, which has 1 slots; raise "
                                      r"cohort_size"):
    for r in range(20):   # P(no overflow in a round) = 0.648^2 ~ 0.42
      st, _ = step(st, ctx.data, jax.random.key(r))
      jax.block_until_ready(st)


def test_poisson_privacy_accounts_with_q():
  """The privacy section follows the run's Poisson sampling: ε is dp_accounting's Poisson-sampled
  Gaussian at the run's q (add/remove adjacency), the noise at the edges is z C on the sum divided
  by the expected cohort q N_e; a counted normalisation and a mismatched section are refused."""
  ctx = _ctx()
  q, z = 0.25, 1.1
  run = _run({"clip_norm": 0.5, "noise_multiplier": z}, sampling="poisson", poisson_q=q)
  del run["cohort_size"]
  p = xp.plan(run.privacy.to_dict(), run_context(ctx, "dp", run), verbose=False)
  assert p.sampling == "poisson" and p.sampling_rate == q and p.normalize == "fixed"
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), 5))
  assert xp.epsilon_after(p, 5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  node = registry.factory_kwargs("dp", run, ctx)["update_paths"][-1].node
  out = node.apply({"w": jnp.zeros((2, 4000))}, jnp.ones(2), {"reported": jnp.ones(2)}, (), jax.random.key(0))
  np.testing.assert_allclose(np.asarray(out[1]), [q * 3, q * 3], rtol=1e-6)
  assert float(out[3]["dp_noise_std"][0]) == pytest.approx(z * 0.5)
  assert float(jnp.std(out[0]["w"][0])) == pytest.approx(z * 0.5, rel=5 / math.sqrt(2 * 4000))
  with pytest.raises(ValueError, match=r"normalize='count' with sampling='poisson'"):
    xp.plan({**run.privacy.to_dict(), "normalize": "count"}, run_context(ctx, "dp", run), verbose=False)
  with pytest.raises(ValueError, match=r"sampling='poisson' but the run samples with sampling='uniform'"):
    xp.plan({"clip_norm": 0.5, "noise_multiplier": z, "sampling": "poisson"},
            run_context(ctx, "dp", _run({})), verbose=False)
  with pytest.raises(ValueError, match=r"the run's sampling='power_of_choice': differential privacy is"):
    xp.plan({"clip_norm": 0.5, "noise_multiplier": z},
            run_context(ctx, "dp", _run({}, sampling="power_of_choice")), verbose=False)


def test_noise_level_on_a_deeper_tree():
  """root -> 2 regions -> 4 edges -> 12 clients (edges of 3 and 3, 2 and 4 clients), cohorts of 2:
  the sensitivity is 2 max_e N_e / k_e at any level above the edges, the noise node's weight is its
  clients; a period > 1 matters at or below the noising level only, and a server below it must be
  FedAvg's."""
  import types

  from fedtree.core.topology import Topology

  topo = Topology.from_sizes(((3, 3), (2, 4)))
  assert topo.depth == 3
  ctx = types.SimpleNamespace(topology=topo, data=types.SimpleNamespace(num_clients=12),
                              config=ml_collections.ConfigDict({"rounds": 3}))

  def plan(level, **extra):
    run = ml_collections.ConfigDict({"algorithm": "hierfavg", "weighting": "uniform", "cohort_size": 2,
                                     **extra})
    return xp.plan({"clip_norm": 1.0, "noise_multiplier": 1.0, "noise_level": level},
                   run_context(ctx, "x", run), verbose=False)

  for level, weights in ((0, [12]), (1, [6, 6]), (-2, [6, 6])):
    p = plan(level)
    assert p.sensitivity == pytest.approx(2 * 4 / 2) and p.node_weight.tolist() == weights
  assert plan(-1).noise_level == 2
  plan(1, periods=(2, 1))   # the root above the regions: post-processing
  with pytest.raises(ValueError, match=r"periods=\(1, 2\): level 1 aggregates every 2 rounds"):
    plan(0, periods=(1, 2))
  plan(1, servers=[{"name": "adam", "learning_rate": 0.1}, {"name": "adam", "learning_rate": 0.1},
                   {"name": "fedavg"}])
  with pytest.raises(ValueError, match=r"at level 2"):
    plan(1, servers=[{"name": "fedavg"}, {"name": "fedavg"}, {"name": "fedavgm"}])
