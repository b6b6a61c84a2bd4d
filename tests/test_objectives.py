"""Vectorized local objectives (FedProx, Ditto, pFedMe, Per-FedAvg) vs per-client loops, and
the algorithms built on them."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_personalization as ref
from helpers import close, count_traces, row, tier_kw

from fedtree import objectives
from fedtree.algorithms import fedavg, hierfavg
from fedtree.algorithms.optimization.fedprox import fedprox
from fedtree.algorithms.personalized.ditto import ditto
from fedtree.algorithms.personalized.perfedavg import perfedavg
from fedtree.algorithms.personalized.pfedme import pfedme
from fedtree.core import loop
from fedtree.core.data import as_device
from fedtree.core.local import ClientData, LocalSchedule
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model

B = 4
LR = 0.1


@pytest.fixture(scope="module")
def setup():
  data, groups = grouped_synthetic(group_sizes=(3, 2), dim=4, num_classes=3, mean_examples=8,
                                   min_examples=3, max_examples=11, test_examples=4, seed=1)
  data = as_device(data)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
  schedule = LocalSchedule(batch_size=B, epochs=1)
  return data, groups, model, schedule


def _client(data, c):
  return ClientData(data.x_train[c], data.y_train[c], data.n_train[c])


def _run_tier(update, data, start, key, schedule, client_state=()):
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), None)
  return tier_kw(update, jax.tree.map(lambda a: a[None], start), sampler(key), data,
                      num_steps=schedule.num_steps(data.n_train),
                      weights=data.n_train.astype(jnp.float32), key=key,
                      client_state=client_state, keep_client_params=True)


def _steps(schedule, data, c):
  return int(schedule.num_steps(np.asarray(data.n_train))[c])


def test_fedprox_update_matches_reference(setup):
  data, _, model, schedule = setup
  start = model.init(jax.random.key(0))
  mu = 0.7
  upd = objectives.fedprox_update(model, optax.sgd(LR), mu=mu, batch_size=B,
                                  max_steps=schedule.max_steps(data.max_train))
  key = jax.random.key(3)
  res = _run_tier(upd, data, start, key, schedule)
  for slot, c in enumerate(np.asarray(_sampled(data))):
    want = ref.sgd(model, start, _client(data, c), _steps(schedule, data, c),
                   jax.random.fold_in(key, c), lr=LR, batch_size=B, mu=mu)
    close(row(res.client_params, slot), want)


def _sampled(data):
  return cohort_sampler(np.zeros(data.num_clients, np.int32), None)(jax.random.key(0)).clients


def test_ditto_update_matches_reference(setup):
  data, _, model, schedule = setup
  start = model.init(jax.random.key(0))
  lam = 0.5
  upd = objectives.ditto_update(model, optax.sgd(LR), lam=lam, batch_size=B,
                                max_steps=schedule.max_steps(data.max_train))
  # Personal models start elsewhere than the anchor, so the proximal term matters.
  personal0 = upd.init_state(model.init(jax.random.key(9)), data.num_clients)
  key = jax.random.key(4)
  res = _run_tier(upd, data, start, key, schedule, client_state=personal0)
  for slot, c in enumerate(np.asarray(_sampled(data))):
    sent, v = ref.ditto(model, start, row(personal0.personal, c), _client(data, c),
                        _steps(schedule, data, c), jax.random.fold_in(key, c), lr=LR, lam=lam,
                        batch_size=B)
    close(row(res.client_params, slot), sent)
    close(row(res.client_state.personal, c), v)


def test_pfedme_update_matches_reference(setup):
  data, _, model, schedule = setup
  start = model.init(jax.random.key(0))
  hp = dict(lam=3.0, inner_steps=3, personal_lr=0.05)
  upd = objectives.pfedme_update(model, learning_rate=0.02, batch_size=B,
                                 max_steps=schedule.max_steps(data.max_train), **hp)
  key = jax.random.key(5)
  res = _run_tier(upd, data, start, key, schedule,
                  client_state=upd.init_state(start, data.num_clients))
  for slot, c in enumerate(np.asarray(_sampled(data))):
    w, theta = ref.pfedme(model, start, _client(data, c), _steps(schedule, data, c),
                          jax.random.fold_in(key, c), lr=0.02, batch_size=B, **hp)
    close(row(res.client_params, slot), w)
    close(row(res.client_state.personal, c), theta)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_update_matches_reference(setup, variant):
  data, _, model, schedule = setup
  start = model.init(jax.random.key(0))
  upd = objectives.perfedavg_update(model, alpha=0.3, beta=0.1, variant=variant, batch_size=B,
                                    max_steps=schedule.max_steps(data.max_train))
  key = jax.random.key(6)
  res = _run_tier(upd, data, start, key, schedule)
  for slot, c in enumerate(np.asarray(_sampled(data))):
    want = ref.perfedavg(model, start, _client(data, c), _steps(schedule, data, c),
                         jax.random.fold_in(key, c), alpha=0.3, beta=0.1, variant=variant,
                         batch_size=B)
    close(row(res.client_params, slot), want)


def test_hessian_free_differs_from_first_order(setup):
  data, _, model, schedule = setup
  start = model.init(jax.random.key(0))
  out = {}
  for v in ("fo", "hf"):
    upd = objectives.perfedavg_update(model, alpha=0.5, beta=0.1, variant=v, batch_size=B,
                                      max_steps=schedule.max_steps(data.max_train))
    out[v] = _run_tier(upd, data, start, jax.random.key(6), schedule).client_params
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree.leaves(out["fo"]), jax.tree.leaves(out["hf"]), strict=True))
  assert diff > 1e-6


def _kw(data, model, schedule, **extra):
  return dict(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=schedule, **extra)


def test_fedprox_mu0_is_fedavg(setup):
  data, groups, model, schedule = setup
  key = jax.random.key(1)
  a = loop.run(fedprox(mu=0.0, **_kw(data, model, schedule, cohort_size=3)), data,
                     num_rounds=3, key=key)
  b = loop.run(fedavg(**_kw(data, model, schedule, cohort_size=3)), data, num_rounds=3,
                     key=key)
  close(a.params, b.params, tol=1e-6)
  # ... and on a tree too.
  topo = Topology.from_labels(groups)
  a = loop.run(fedprox(mu=0.0, topology=topo, **_kw(data, model, schedule, periods=2)), data,
                     num_rounds=2, key=key)
  b = loop.run(hierfavg(topology=topo, **_kw(data, model, schedule, periods=2)), data,
                     num_rounds=2, key=key)
  close(a.params, b.params, tol=1e-6)


def test_ditto_personal_models_untouched_for_unsampled_clients(setup):
  data, groups, model, schedule = setup
  alg = ditto(lam=0.3, topology=Topology.from_labels(groups),
              **_kw(data, model, schedule, cohort_size=1))
  state = alg.init(jax.random.key(0))
  step = jax.jit(alg.round)
  for r in range(3):
    key = jax.random.fold_in(jax.random.key(2), r)
    before = state.client_state.personal
    state, _ = step(state, data, key)
    trained = np.asarray(alg_cohort(groups, key))
    for c in range(data.num_clients):
      after = jax.tree.leaves(state.client_state.personal)
      same = all(np.array_equal(np.asarray(x[c]), np.asarray(y[c]))
                 for x, y in zip(jax.tree.leaves(before), after, strict=True))
      assert same == (c not in trained), (r, c, trained)
  assert set(alg.models(state)) == {"global", "level1", "personal"}


def alg_cohort(groups, key):
  from fedtree.core.rng import stream

  return cohort_sampler(groups, 1)(stream(key, "cohort")).clients


def test_pfedme_server_step_matches_reference(setup):
  """Θ ← (1-β)Θ + β Σ p_i w_i with the w_i of the per-client loop."""
  data, _, model, schedule = setup
  hp = dict(lam=2.0, inner_steps=2, personal_lr=0.05)
  beta, lr = 0.6, 0.03
  alg = pfedme(beta=beta, learning_rate=lr, **hp, **_kw(data, model, schedule))
  state = alg.init(jax.random.key(0))
  theta = row(state.params[0], 0)
  key = jax.random.key(7)
  new, _ = jax.jit(alg.round)(state, data, key)
  from fedtree.core.rng import stream

  tkey = stream(key, "train")
  n = np.asarray(data.n_train, np.float64)
  ws = [ref.pfedme(model, theta, _client(data, c), _steps(schedule, data, c),
                   jax.random.fold_in(tkey, c), lr=lr, batch_size=B, **hp)[0]
        for c in range(data.num_clients)]
  mean_w = jax.tree.map(
    lambda *a: sum(float(ni) * ai for ni, ai in zip(n, a, strict=True)) / n.sum(), *ws
  )
  want = jax.tree.map(lambda t, m: (1 - beta) * t + beta * m, theta, mean_w)
  close(row(new.params[0], 0), want)


def test_pfedme_with_one_inner_step_and_eta_lambda_one_is_fedavg(setup):
  """A reduction of pFedMe, proved: with K = 1, η = 1/λ and β = 1, pFedMe is FedAvg with
  local SGD at rate ``personal_lr``.

  Proof. A round starts with θ = w = Θ. Suppose θ = w at the start of a local round. The
  single inner step is θ' = θ - p(∇f(θ) + λ(θ - w)) = w - p∇f(w) (the proximal term
  vanishes). Then w' = w - ηλ(w - θ') = θ' because ηλ = 1, so θ' = w' again: by induction
  every local round is one SGD step w ← w - p∇f(w; batch) on the same minibatches, and the
  model sent up is the SGD iterate. The server with β = 1 is sgd(1) on the pseudo-gradient,
  i.e. FedAvg. ∎ (The personal model θ̂ equals the model sent up.)
  """
  data, _, model, schedule = setup
  lam, p = 4.0, 0.07
  key = jax.random.key(11)
  alg = pfedme(lam=lam, inner_steps=1, personal_lr=p, learning_rate=1 / lam, beta=1.0,
               **_kw(data, model, schedule, cohort_size=3))
  a = loop.run(alg, data, num_rounds=3, key=key)
  kw = _kw(data, model, schedule, cohort_size=3)
  kw["local_optimizer"] = optax.sgd(p)
  b = loop.run(fedavg(**kw), data, num_rounds=3, key=key)
  close(a.params, b.params)


def test_beta_mixing_is_sgd_beta_on_the_pseudo_gradient():
  theta = {"w": jnp.array([1.0, -2.0])}
  mean_w = {"w": jnp.array([0.5, 3.0])}
  beta = 0.3
  opt = optax.sgd(beta)
  delta = jax.tree.map(jnp.subtract, theta, mean_w)
  upd, _ = opt.update(delta, opt.init(theta), theta)
  mixed = jax.tree.map(lambda t, m: (1 - beta) * t + beta * m, theta, mean_w)
  close(optax.apply_updates(theta, upd), mixed)


def test_perfedavg_adapted_model_is_one_alpha_step(setup):
  data, _, model, schedule = setup
  alpha = 0.2
  alg = perfedavg(alpha=alpha, beta=0.05, **_kw(data, model, schedule))
  state = alg.init(jax.random.key(0))
  models = alg.models(state)
  glob = row(models["global"].params, 0)
  adapted = models["adapted"].params
  for c in range(data.num_clients):
    # One step, batch B, from the client's training data, rate α.
    from fedtree.core.rng import stream

    key = jax.random.fold_in(stream(jax.random.key(0), "perfedavg_adapt"), 0)
    want = ref.sgd(model, glob, _client(data, c), 1, jax.random.fold_in(key, c), lr=alpha,
                   batch_size=B)
    close(row(adapted, c), want)


def test_rounds_compile_once(setup):
  data, groups, model, schedule = setup
  for make in (lambda kw: ditto(lam=0.1, **kw),
               lambda kw: pfedme(lam=2.0, inner_steps=2, personal_lr=0.05, learning_rate=0.05,
                                 **kw),
               lambda kw: perfedavg(alpha=0.1, beta=0.1, variant="hf", **kw)):
    alg = make(_kw(data, model, schedule, cohort_size=2))
    counted, traces = count_traces(alg)
    loop.run(counted, data, num_rounds=4, key=jax.random.key(0), rounds_per_call=2)
    assert len(traces) == 1, alg.name


def _pfedme(m, **kw):
  hp = dict(lam=1.0, inner_steps=2, personal_lr=0.1, learning_rate=0.1)
  hp.update(kw)
  return objectives.pfedme_update(m, batch_size=B, max_steps=2, **hp)


def _perfedavg(m, **kw):
  hp = dict(alpha=0.1, beta=0.1)
  hp.update(kw)
  return objectives.perfedavg_update(m, batch_size=B, max_steps=2, **hp)


@pytest.mark.parametrize("bad,match", [
  (lambda m: objectives.fedprox_update(m, optax.sgd(0.1), mu=-1.0, batch_size=B, max_steps=2),
   "mu=-1.0"),
  (lambda m: objectives.ditto_update(m, optax.sgd(0.1), lam=-0.1, batch_size=B, max_steps=2),
   "lam=-0.1"),
  (lambda m: _pfedme(m, lam=-1.0), "lam=-1.0"),
  (lambda m: _pfedme(m, personal_lr=-0.1), "personal_lr=-0.1"),
  (lambda m: _pfedme(m, learning_rate=0.0), "learning_rate=0.0"),
  (lambda m: _pfedme(m, inner_steps=0), "inner_steps=0"),
  (lambda m: _perfedavg(m, alpha=-0.1), "alpha=-0.1"),
  (lambda m: _perfedavg(m, beta=float("nan")), "beta=nan"),
  (lambda m: _perfedavg(m, variant="so"), "variant='so'"),
])
def test_bad_hyperparameters_raise(setup, bad, match):
  with pytest.raises(ValueError, match=match):
    bad(setup[2])


def test_bad_algorithm_hyperparameters_raise(setup):
  data, _, model, schedule = setup
  with pytest.raises(ValueError, match="beta=-0.5"):
    pfedme(lam=1.0, inner_steps=1, personal_lr=0.1, learning_rate=0.1, beta=-0.5,
           **_kw(data, model, schedule))
  with pytest.raises(ValueError, match="lam=-2"):
    ditto(lam=-2, **_kw(data, model, schedule))
