"""Issue 51, the distillation family: FedDF (Lin et al. 2020, Algorithm 1) against a per-client loop —
every sampled client's SGD by hand, the server's mean by examples, then Adam steps of the student on
``T² KL(softmax(mean teacher logits / T) ‖ softmax(student / T))`` over the public batches, the teacher a
Python loop over the clients' models; its refusals; the run's stand-in public inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_personalization as pref
from reference_baselines import close, np64, run_jit, small_problem, start

from fedtree.algorithms import feddf
from fedtree.algorithms.heterogeneous.feddf import public_batch
from fedtree.core.local import LocalSchedule
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler

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
  theta = start(alg)
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), 4)
  for r in range(2):
    rk = jax.random.fold_in(key, r)
    drawn = sampler(stream(rk, "cohort"))
    clients = [int(c) for c, v in zip(np.asarray(drawn.clients), np.asarray(drawn.valid), strict=True) if v]
    sent = [pref.sgd(model, theta, pref.client_cdata(data, c), STEPS,
                     jax.random.fold_in(stream(rk, "train"), c), lr=LR, batch_size=BS) for c in clients]
    n = np.asarray([float(data.n_train[c]) for c in clients])
    student = jax.tree.map(
      lambda *m, n=n: sum(w * np.asarray(a, np.float64) for w, a in zip(n, m, strict=True)) / n.sum(), *sent)
    student = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), student)
    adam = optax.adam(DLR)
    opt = adam.init(student)
    for j in range(DISTILL):
      x = public[np.asarray(public_batch(0, r, j, len(public), DBS))]
      teacher = sum(model.apply(m, x) for m in sent) / len(sent)

      def kl(p, x=x, teacher=teacher):
        q = jax.nn.softmax(teacher / T)
        log_s = jax.nn.log_softmax(model.apply(p, x) / T)
        return T * T * jnp.mean(jnp.sum(q * (jnp.log(q) - log_s), axis=-1))

      updates, opt = adam.update(jax.grad(kl)(student), opt, student)
      student = optax.apply_updates(student, updates)
    theta = student
  close(jax.tree.map(lambda p: p[0], state.params[0]), np64(theta), atol=5e-5)
  assert float(metrics["distill_loss"]) > 0


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
