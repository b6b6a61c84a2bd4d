"""Byzantine clients (fedtree.toolbox.attacks): the malicious mask, the attacks on one update against
a per-client loop, the omniscient attacks against a per-parent numpy reference, and through
FedAvg: no attacker is bitwise today's run, one compile per round."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import count_traces, tiny_mlp_problem, trees_equal
from scipy.stats import norm as normal
from test_robust import _block, _flat

from fedtree.algorithms import fedavg
from fedtree.core.updates import ClientContext, UpdatePath
from fedtree.experiment.capabilities import robust as sections
from fedtree.toolbox import attacks, robust


# ------------------------------------------------------------------------ the mask
def test_fixed_fraction_is_exact_nested_and_sweepable():
  a = attacks.attackers(50, fraction=0.2, seed=3)
  ids = jnp.arange(50)
  m = np.asarray(a.mask(ids, None))
  assert m.sum() == 10
  bigger = np.asarray(attacks.attackers(50, fraction=0.4, seed=3).mask(ids, None))
  assert bigger.sum() == 20 and np.all(bigger[m])                 # the 20 % are among the 40 %
  assert np.asarray(attacks.attackers(50, fraction=0.2, seed=4).mask(ids, None)).sum() == 10
  traced = jax.jit(lambda f: attacks.Attackers(order=a.order, fraction=f).mask(ids, None))
  np.testing.assert_array_equal(np.asarray(traced(0.2)), m)
  assert not np.asarray(a.mask(jnp.array([-1, 50, 10_000]), None)).any()


def test_ids_and_redraw():
  a = attacks.attackers(6, ids=(1, 4))
  np.testing.assert_array_equal(np.asarray(a.mask(jnp.arange(6), None)), [0, 1, 0, 0, 1, 0])
  r = attacks.attackers(4000, fraction=0.3, redraw=True)
  m0 = np.asarray(r.mask(jnp.arange(4000), jax.random.key(0)))
  m1 = np.asarray(r.mask(jnp.arange(4000), jax.random.key(1)))
  tol = 4 * np.sqrt(0.3 * 0.7 / 4000)
  assert abs(m0.mean() - 0.3) < tol and abs(m1.mean() - 0.3) < tol
  assert abs((m0 & m1).mean() - 0.09) < 4 * np.sqrt(0.09 * 0.91 / 4000)   # independent rounds


def test_bad_attackers_are_refused():
  with pytest.raises(ValueError, match="give one of fraction= and ids="):
    attacks.attackers(5)
  with pytest.raises(ValueError, match=r"fraction=1.5 must be in \[0, 1\]"):
    attacks.attackers(5, fraction=1.5)
  with pytest.raises(ValueError, match=r"ids=\[7\] must lie in \[0, 5\)"):
    attacks.attackers(5, ids=[7])
  with pytest.raises(ValueError, match="attack='boom' is not an omniscient attack; choose one of"):
    sections.omniscient_attack("boom")
  with pytest.raises(ValueError, match="perturbation='x'; choose one of"):
    attacks.min_max(perturbation="x")
  # an omniscient attack's hyperparameter given to another one is refused, not dropped
  with pytest.raises(ValueError, match=r"alie: \['eps'\] are other omniscient attacks' hyperparameters; "
                                       r"alie takes \['z'\]"):
    sections.omniscient_attack("alie", eps=2.0)
  assert sections.omniscient_attack("min_sum", perturbation="unit").pairwise


# ------------------------------------------------------------------------ one update
@pytest.mark.parametrize("name,make,ref", [
  ("sign_flip", lambda a: attacks.sign_flip(a, scale=2.0), lambda d: -2.0 * d),
  ("scaling", lambda a: attacks.scaling(a, factor=5.0), lambda d: 5.0 * d),
])
def test_client_attacks_against_a_per_client_loop(name, make, ref):
  a = attacks.attackers(6, ids=(0, 3))
  t = make(a)
  delta = {"w": jax.random.normal(jax.random.key(0), (6, 3, 2))}
  ctx = ClientContext(jnp.arange(6), jnp.zeros(6, jnp.int32), jnp.ones(6), {})
  out, _, st = jax.vmap(t.apply)(delta, jnp.zeros(6), jax.random.split(jax.random.key(1), 6), ctx)
  for c in range(6):
    want = ref(np.asarray(delta["w"][c])) if c in (0, 3) else np.asarray(delta["w"][c])
    np.testing.assert_allclose(np.asarray(out["w"][c]), want, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(st["attackers"]), [1, 0, 0, 1, 0, 0])


def test_gaussian_attack_replaces_only_attackers():
  t = attacks.gaussian(attacks.attackers(400, ids=range(200)), std=3.0)
  delta = jnp.ones((400, 50))
  ctx = ClientContext(jnp.arange(400), jnp.zeros(400, jnp.int32), jnp.ones(400), {})
  out, _, _ = jax.vmap(t.apply)(delta, jnp.zeros(400), jax.random.split(jax.random.key(1), 400), ctx)
  out = np.asarray(out)
  assert np.all(out[200:] == 1.0)
  noise = out[:200].ravel()
  n = noise.size
  assert abs(noise.mean()) < 4 * 3.0 / np.sqrt(n) and abs(noise.std() - 3.0) < 4 * 3.0 / np.sqrt(2 * n)


# ------------------------------------------------------------------------ omniscient
def ref_malicious(benign, n, m, attack, z=None, eps=0.1, gamma_init=10.0, iterations=20, perturbation="std"):
  mu, sigma = benign.mean(0), benign.std(0)
  if attack == "alie":
    if z is None:
      s = np.floor(n / 2 + 1) - m
      z = normal.ppf(np.clip((n - s) / n, 1e-6, 1 - 1e-6))
    return mu - z * sigma
  if attack == "ipm":
    return -eps * mu
  p = {"std": -sigma, "unit": -mu / np.linalg.norm(mu), "sign": -np.sign(mu)}[perturbation]
  d = ((benign[:, None] - benign[None]) ** 2).sum(-1)
  bound = d.max() if attack == "min_max" else d.sum(1).max()
  gamma, stride, best = gamma_init, gamma_init / 2, 0.0
  for _ in range(iterations):
    x = mu + gamma * p
    d2 = ((x - benign) ** 2).sum(-1)
    ok = (d2.max() if attack == "min_max" else d2.sum()) <= bound
    best = gamma if ok else best
    gamma, stride = gamma + (stride if ok else -stride), stride / 2
  return mu + best * p


@pytest.mark.parametrize("attack,hyper", [
  ("alie", {}), ("alie", {"z": 1.5}), ("ipm", {"eps": 2.0}), ("min_max", {}),
  ("min_sum", {"perturbation": "unit"}), ("min_max", {"perturbation": "sign"}),
])
def test_omniscient_attacks_against_a_per_parent_reference(attack, hyper):
  block, flat, valid, _ = _block(seed=2)
  clients = np.asarray(block.clients)
  bad_ids = clients[valid][::3]                       # a third of the valid slots attack
  a = attacks.attackers(int(clients.max()) + 1, ids=bad_ids)
  poisoned, bad = attacks.poison_block(block, a, jax.random.key(0), sections.OMNISCIENT[attack](**hyper))
  bad = np.asarray(bad)
  np.testing.assert_array_equal(bad, np.isin(clients, bad_ids) & valid)
  out = _flat_block(poisoned.deltas)
  for p in range(flat.shape[0]):
    benign = flat[p][valid[p] & ~bad[p]].astype(np.float64)
    for k in range(flat.shape[1]):
      if bad[p, k] and len(benign):
        want = ref_malicious(benign, valid[p].sum(), bad[p].sum(), attack, **hyper)
        np.testing.assert_allclose(out[p, k], want, rtol=1e-4, atol=1e-4, err_msg=f"{attack} {p} {k}")
      else:
        np.testing.assert_array_equal(out[p, k], flat[p, k])


def _flat_block(tree):
  a = np.asarray(tree["a"])
  return np.concatenate([a.reshape(a.shape[:2] + (-1,)), np.asarray(tree["b"])], axis=2)


def test_omniscient_wrapper_then_aggregates():
  block, *_ = _block(seed=2)
  a = attacks.attackers(64, fraction=0.3, seed=1)
  agg = attacks.omniscient(robust.median(), a, attacks.alie())
  s, w, st = agg.aggregate(block, {}, jax.random.key(0))
  poisoned, bad = attacks.poison_block(block, a, jax.random.fold_in(jax.random.key(0), 0), attacks.alie())
  s2, w2, _ = robust.median().aggregate(poisoned, {}, None)
  np.testing.assert_array_equal(_flat(s), _flat(s2))
  np.testing.assert_array_equal(np.asarray(st["attackers"]), np.asarray(bad).sum(1))
  assert agg.name == "alie+median"
  assert attacks.omniscient(UpdatePath().aggregator, a, attacks.ipm()).blockwise   # the mean, blockwise


# ------------------------------------------------------------------------ through FedAvg
def _fedavg(update_paths, cohort_size=None):
  data, model, schedule = tiny_mlp_problem()
  return fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule,
                update_paths=update_paths, cohort_size=cohort_size), data


def test_no_attacker_is_bitwise_and_compiles_once():
  plain, data = _fedavg(None)
  none = attacks.attackers(data.num_clients, fraction=0.0)
  attacked, _ = _fedavg(UpdatePath(client=attacks.sign_flip(none)))
  counted, traces = count_traces(attacked)
  step_a, step_b = jax.jit(plain.round), jax.jit(counted.round)
  sa, sb = plain.init(jax.random.key(0)), attacked.init(jax.random.key(0))
  for r in range(3):
    k = jax.random.fold_in(jax.random.key(1), r)
    sa, _ = step_a(sa, data, k)
    sb, mb = step_b(sb, data, k)
    assert float(mb["attackers"]) == 0.0
  trees_equal(sa.params, sb.params)
  assert len(traces) == 1


def test_omniscient_attack_with_a_robust_aggregator_through_fedavg():
  """ALIE by 2 of 5 clients in front of the median, through FedAvg: one compile, the round's
  metric counts the attackers of the (one) parent."""
  alg, data = _fedavg(UpdatePath(aggregator=attacks.omniscient(
    robust.median(), attacks.attackers(5, ids=(0, 3)), attacks.alie())))
  counted, traces = count_traces(alg)
  step = jax.jit(counted.round)
  s = alg.init(jax.random.key(0))
  for r in range(2):
    s, m = step(s, data, jax.random.fold_in(jax.random.key(1), r))
    assert float(m["attackers"]) == 2.0 and np.isfinite(float(m["train_loss"]))
  assert len(traces) == 1
