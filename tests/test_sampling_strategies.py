"""Client sampling strategies (fedtree.core.sampling): empirical frequencies against the exact
probabilities of each rule, within 4 standard errors of the sample size."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import tiny_mlp_problem

from fedtree.algorithms import fedavg
from fedtree.core.sampling import Cohort, cohort_sampler, top_scores, weighted_cohort
from fedtree.toolbox.systems import Systems, make_availability, make_profile

DRAWS = 4000


def successive_inclusion(w, k):
  """Exact inclusion probabilities of successive sampling without replacement ∝ ``w``."""
  w = np.asarray(w, np.float64)
  incl = np.zeros(len(w))
  for seq in itertools.permutations(np.flatnonzero(w > 0), k):
    p, left = 1.0, w.sum()
    for i in seq:
      p *= w[i] / left
      left -= w[i]
    incl[list(seq)] += p
  return incl


def draws(fn, n=DRAWS):
  return jax.jit(jax.vmap(fn))(jax.random.split(jax.random.key(0), n))


def within(freq, prob, n):
  se = np.sqrt(prob * (1 - prob) / n)
  np.testing.assert_array_less(np.abs(freq - prob), 4 * se + 1e-9)


@pytest.mark.parametrize("k", [1, 2])
def test_data_size_sampling_is_successive_sampling(k):
  w = np.array([1.0, 2.0, 3.0, 0.0, 6.0, 4.0])
  parent = np.array([0, 0, 0, 0, 1, 1])   # a second parent whose cohort is 1
  sampler = cohort_sampler(parent, [k, 1])
  out = draws(lambda key: weighted_cohort(sampler, key, jnp.asarray(w)))
  clients, valid = np.asarray(out.clients), np.asarray(out.valid)
  assert valid.all() and np.all(parent[clients] == np.asarray(out.parent))
  for g, members in ((0, [0, 1, 2, 3]), (1, [4, 5])):
    kg = k if g == 0 else 1
    chosen = clients[:, np.asarray(out.parent[0]) == g]
    assert np.all([len(set(row)) == kg for row in chosen])          # without replacement
    freq = np.array([(chosen == i).any(axis=1).mean() for i in members])
    within(freq, successive_inclusion(w[members], kg), DRAWS)


def test_availability_aware_sampling_is_uniform_over_the_online():
  online = np.array([1, 0, 1, 1, 0, 1, 1, 0], np.float32)
  sampler = cohort_sampler(np.zeros(8, np.int32), 3)
  out = draws(lambda key: weighted_cohort(sampler, key, jnp.asarray(online)))
  clients = np.asarray(out.clients)
  assert np.all(online[clients] == 1)
  freq = np.array([(clients == i).any(axis=1).mean() for i in range(8)])
  within(freq, online * 3 / online.sum(), DRAWS)
  # fewer on line than slots: the rest of the cohort is invalid, never an off-line client
  few = weighted_cohort(sampler, jax.random.key(1), jnp.asarray([0, 0, 1, 0, 0, 0, 0, 0.0]))
  assert np.asarray(few.valid).tolist() == [True, False, False] and int(few.clients[0]) == 2


def test_power_of_choice_probabilities():
  """Candidates d=3 of 5 ∝ w, then the highest loss: client i is chosen when it is a candidate
  and no higher-loss client is (exact probability by enumerating the candidate sequences)."""
  w = np.array([1.0, 3.0, 2.0, 1.0, 3.0])
  loss = np.array([0.5, 0.1, 0.9, 0.7, 0.3])
  cand_sampler, sampler = cohort_sampler(np.zeros(5, np.int32), 3), cohort_sampler(np.zeros(5, np.int32), 1)

  def pick(key):
    cands = weighted_cohort(cand_sampler, key, jnp.asarray(w))
    return top_scores(sampler, cands, jnp.asarray(loss)[cands.clients]).clients

  got = np.asarray(draws(pick))[:, 0]
  prob = np.zeros(5)
  for seq in itertools.permutations(range(5), 3):
    p, left = 1.0, w.sum()
    for i in seq:
      p *= w[i] / left
      left -= w[i]
    prob[max(seq, key=lambda i: loss[i])] += p
  within(np.bincount(got, minlength=5) / DRAWS, prob, DRAWS)


def test_top_scores_per_parent_and_invalid_candidates():
  sampler = cohort_sampler(np.array([0, 0, 0, 1, 1, 1]), [2, 1])
  cands = Cohort(jnp.array([0, 1, 2, 3, 4, 5]), jnp.array([0, 0, 0, 1, 1, 1]),
                 jnp.array([True, True, True, True, False, False]))
  out = top_scores(sampler, cands, jnp.array([1.0, 3.0, 2.0, 0.0, 9.0, 9.0]))
  assert out.clients.tolist() == [1, 2, 3] and out.valid.tolist() == [True, True, True]
  assert out.parent.tolist() == [0, 0, 1]


@pytest.fixture(scope="module")
def problem():
  return tiny_mlp_problem()


def test_hierfavg_strategies_and_bad_input(problem):
  data, model, schedule = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, chunk_size=None)
  with pytest.raises(ValueError, match=r"sampling='best'; choose one of"):
    fedavg(sampling="best", **common)
  with pytest.raises(ValueError, match=r"sampling='available' needs systems="):
    fedavg(sampling="available", cohort_size=2, **common)
  with pytest.raises(ValueError, match=r"candidates=1 must be >= the cohort"):
    fedavg(sampling="power_of_choice", candidates=1, cohort_size=2, **common)
  with pytest.raises(ValueError, match=r"candidates=3 is for sampling='power_of_choice'"):
    fedavg(candidates=3, **common)
  # availability-aware: only clients 1 and 3 are on line, so only they ever train
  avail = make_availability([[(0, 0)], [(0, 1)], [(0, 0)], [(0, 1)], [(0, 0)]], 1.0)
  prof = make_profile(np.ones(5), np.full(5, 1e9))
  alg = fedavg(sampling="available", cohort_size=3, systems=Systems(profile=prof, availability=avail),
               client_update=None, **common)
  state, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
  assert int(m["clients_trained"]) == 2 and int(m["clients_dropped"]) == 0
  alg = fedavg(sampling="power_of_choice", cohort_size=2, **common)
  state, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
  assert int(m["clients_trained"]) == 2 and np.isfinite(float(m["train_loss"]))


def test_power_of_choice_on_ragged_data_equals_padded(problem):
  """Candidate losses read from the flat (ragged) rows, a chunk at a time, are the padded ones; the
  cohorts drawn are the same."""
  from fedtree.core.ragged import to_ragged_train
  from fedtree.core.sampling import candidate_losses, sampling_strategy

  data, model, _ = problem
  ragged = to_ragged_train(data)
  assert ragged.ragged
  params = jax.tree.map(lambda a: a[None], model.init(jax.random.key(0)))
  cand = Cohort(jnp.array([4, 0, 2, 3, 1], jnp.int32), jnp.zeros(5, jnp.int32), jnp.ones(5, bool))
  def losses(d, chunk):
    return np.asarray(jax.jit(lambda p: candidate_losses(model, p, cand, d, chunk_size=chunk))(params))

  want = losses(data, None)
  for d, chunk in ((data, 2), (ragged, None), (ragged, 2)):
    np.testing.assert_allclose(losses(d, chunk), want, rtol=1e-6)
  sampler = cohort_sampler(np.zeros(5, np.int32), 2)
  draws_ = [(jax.jit(jax.vmap(sampling_strategy(sampler, "power_of_choice", data=d, model=model, candidates=4,
                                                  chunk_size=c).draw, in_axes=(0, None, None, None))), d)
            for d, c in ((data, None), (ragged, 3))]
  a, b = (f(jax.random.split(jax.random.key(0), 8), params, 0.0, d) for f, d in draws_)
  np.testing.assert_array_equal(np.asarray(a.clients), np.asarray(b.clients))
  with pytest.raises(ValueError, match=r"chunk_size=0 must be >= 1"):
    sampling_strategy(sampler, "power_of_choice", data=ragged, model=model, chunk_size=0)
  alg = fedavg(model=model, data=ragged, local_optimizer=optax.sgd(0.1), schedule=problem[2], chunk_size=None,
               sampling="power_of_choice", cohort_size=2)
  _, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), ragged, jax.random.key(1))
  assert int(m["clients_trained"]) == 2 and np.isfinite(float(m["train_loss"]))
