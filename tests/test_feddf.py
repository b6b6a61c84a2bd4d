"""Issue 51, the distillation family: FedDF (Lin et al. 2020, Algorithm 1) against a per-client loop —
every sampled client's SGD by hand, the server's mean by examples, then Adam steps of the student on
``T² KL(softmax(mean teacher logits / T) ‖ softmax(student / T))`` over the public batches, the teacher a
Python loop over the clients' models; FedMD (Li and Wang 2019) against a loop of every client's own
model digesting, revisiting and scoring; their refusals; the run's stand-in public inputs."""

import jax
import numpy as np
import optax
import pytest
from reference_baselines import close, np64, run_jit, small_problem, start
from reference_heterogeneous import feddf_reference, fedmd_reference

from fedtree.algorithms import feddf, fedmd
from fedtree.core.local import LocalSchedule

LR, STEPS, BS, DISTILL, DBS, DLR, T = 0.1, 3, 4, 4, 5, 0.01, 2.0


@pytest.fixture(scope="module")
def problem():
  data, _, model = small_problem()
  public = np.asarray(jax.random.normal(jax.random.key(5), (12,) + tuple(data.example_shape)))
  return data, model, public


def common(problem, **kw):
  data, model, public = problem
  return dict(model=model, data=data, local_optimizer=optax.sgd(LR),
              schedule=LocalSchedule(batch_size=BS, steps=STEPS), public=public, distill_steps=DISTILL,
              distill_batch_size=DBS, distill_learning_rate=DLR, temperature=T, **kw)


def test_feddf_is_fedavg_then_distillation_from_the_clients_ensemble(problem):
  data, model, public = problem
  alg = feddf(cohort_size=4, **common(problem))
  key = jax.random.key(2)
  state, metrics = run_jit(alg, data, 2, key)
  theta = feddf_reference(model, data, start(alg), 2, key, cohort_size=4, lr=LR, steps=STEPS, batch_size=BS,
                          public=public, distill_steps=DISTILL, distill_batch_size=DBS, distill_lr=DLR,
                          temperature=T)
  close(jax.tree.map(lambda p: p[0], state.params[0]), np64(theta), atol=5e-5)
  assert float(metrics["distill_loss"]) > 0


def test_fedmd_clients_digest_the_consensus_then_revisit_their_data(problem):
  data, model, public = problem
  kw = {k: v for k, v in common(problem).items() if not k.startswith(("distill", "temperature"))}
  alg = fedmd(cohort_size=4, public_subset=5, digest_steps=3, digest_learning_rate=0.01, **kw)
  key = jax.random.key(4)
  state, _ = run_jit(alg, data, 3, key)
  assert sorted(alg.models(state)) == ["personal"]
  own = fedmd_reference(model, data, start(alg), 3, key, cohort_size=4, lr=LR, steps=STEPS, batch_size=BS,
                        public=public, subset=5, digest_steps=3, digest_lr=0.01)
  personal = alg.models(state)["personal"].params
  for c in range(data.num_clients):
    close(jax.tree.map(lambda p, c=c: p[c], personal), np64(own[c]), atol=5e-5)


def test_refusals_and_the_runs_stand_in_public_inputs(problem):
  data, _, public = problem
  with pytest.raises(ValueError, match="feddf: public=None; FedDF distills on unlabeled public inputs"):
    feddf(**{**common(problem), "public": None})
  with pytest.raises(ValueError, match=r"feddf: public has shape \(12, 3\); it must be \[P, \*example"):
    feddf(**{**common(problem), "public": public[:, :3]})
  with pytest.raises(ValueError, match="feddf: distill_steps=0 must be a finite number > 0"):
    feddf(**{**common(problem), "distill_steps": 0})
  with pytest.raises(ValueError, match="server_optimizers"):
    feddf(server_optimizers=optax.adam(0.1), **common(problem))
  from fedtree.experiment.registry.converters import convert_public

  class Ctx:
    pass

  ctx = Ctx()
  ctx.data = data
  got = convert_public({"public_examples": 7, "public_seed": 1}, ctx)["public"]
  pool = {tuple(np.asarray(data.x_train[c, i]).round(6)) for c in range(data.num_clients)
          for i in range(int(data.n_train[c]))}
  assert got.shape == (7,) + tuple(data.example_shape) and all(tuple(row.round(6)) in pool for row in got)
  with pytest.raises(ValueError, match="public_examples=0 must be >= 1"):
    convert_public({"public_examples": 0}, ctx)
