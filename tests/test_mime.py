"""Mime and MimeLite: the vectorized rounds against a per-client loop written from Algorithm 1
with SGD and momentum as the base optimizer (by data size as FedJAX, uniformly as the paper; on a
tree), their reductions to FedAvg, the bytes they send, the update clipping, and the refusals."""

import jax
import numpy as np
import optax
import pytest
import reference_baselines as ref
from helpers import clipped

from fedtree.algorithms import fedavg, mime, mimelite
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.models import build_model
from fedtree.toolbox.compression import qsgd, uplink
from fedtree.toolbox.privacy import central, clip
from fedtree.toolbox.robust import median

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  return ref.small_problem()


def _reference(
  model,
  data,
  x0,
  parent,
  rounds,
  key,
  *,
  cohort_size,
  corrected,
  momentum,
  eta_g,
  weights,
  steps,
  root_period=None,
  dtype=np.float32,
  combine=None,
  transform=None,
):
  """Algorithm 1 per parent of clients with SGD + momentum ``ρ`` as the base optimizer: the parent's
  momentum ``m`` fixed in every client step, ``m ← ḡ + ρ m`` with ``ḡ`` the weighted mean full-batch
  gradient at ``x`` of the round's clients (Mime: ``c = ḡ`` computed before they train), and
  ``x ← x − η_g mean (x − y_i)``; the root (if any) averages the parents every ``root_period`` rounds
  (the clients in ``dtype``: float64 in tests/x64_references.py). MimeLite under uniform weights:
  ``transform((x − y_i, g_i))`` each client's pair as its path leaves it (a joint clip), ``combine(list
  of trees)`` the parent's estimate of the updates and of the gradients alike (default the mean)."""
  parent = np.asarray(parent)
  zeros = jax.tree.map(np.zeros_like, ref.np64(x0))
  num_parents = int(parent.max()) + 1
  m = [zeros for _ in range(num_parents)]
  c = [zeros for _ in range(num_parents)]

  def mean_gradient(x, clients):
    w = [weights[k] for k in clients]
    gs = [ref.full_gradient(model, jax.tree.map(dtype, x), data, k, B) for k in clients]
    return jax.tree.map(lambda *g: sum(wi * gi for wi, gi in zip(w, g, strict=True)) / sum(w), *gs)

  def before(p, x, clients):
    if corrected:
      c[p] = mean_gradient(x, clients)

  def client(rk, k, p, x):
    return ref.mime_client(
      model,
      x,
      m[p],
      c[p],
      data,
      k,
      steps[k],
      ref.train_key(rk, k),
      lr=LR,
      batch_size=B,
      momentum=momentum,
      corrected=corrected,
      dtype=dtype,
    )

  def server(p, x, answers):
    w = [weights[k] for k, _ in answers]
    if combine is not None or transform is not None:
      pairs = [(jax.tree.map(lambda xx, yy: xx - np.asarray(yy, np.float64), x, y),
                ref.full_gradient(model, jax.tree.map(dtype, x), data, k, B)) for k, y in answers]
      pairs = [transform(pr) if transform is not None else pr for pr in pairs]
      est = combine or (lambda trees: jax.tree.map(lambda *a: sum(a) / len(a), *trees))
      step, g = est([d for d, _ in pairs]), est([gg for _, gg in pairs])
      m[p] = jax.tree.map(lambda gg, mm: gg + momentum * mm, g, m[p])
      return jax.tree.map(lambda xx, d: xx - eta_g * d, x, step)
    step = jax.tree.map(
      lambda xx, *y: (
        sum(wi * (xx - np.asarray(yi, np.float64)) for wi, yi in zip(w, y, strict=True)) / sum(w)
      ),
      x,
      *[y for _, y in answers],
    )
    g = c[p] if corrected else mean_gradient(x, [k for k, _ in answers])
    m[p] = jax.tree.map(lambda gg, mm: gg + momentum * mm, g, m[p])
    return jax.tree.map(lambda xx, d: xx - eta_g * d, x, step)

  total = np.bincount(parent, weights=weights)
  x = ref.run_rounds(
    data,
    x0,
    parent,
    rounds,
    key,
    cohort_size=cohort_size,
    client=client,
    server=server,
    root_period=root_period,
    root_weights=list(total) if root_period else None,
    before=before,
  )
  return x, m, c


def _trace(state):
  """The momentum of the base optimizer ``optax.sgd(lr, momentum)`` in a Mime server state."""
  return state.server_state.statistics[0].trace


@pytest.mark.parametrize(
  "method,weighting,eta_g",
  [
    pytest.param(mimelite, "examples", 1.0, marks=pytest.mark.slow),
    (mimelite, "uniform", 0.7),
    (mime, "examples", 1.0),
  ],
)
def test_mime_matches_algorithm_1_per_client(problem, method, weighting, eta_g):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  rho = 0.9
  alg = method(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR, momentum=rho),
    schedule=sched,
    cohort_size=4,
    chunk_size=2,
    weighting=weighting,
    server_learning_rate=eta_g,
  )
  key = jax.random.key(11)
  state, _ = ref.run_jit(alg, data, 3, key)
  x0 = ref.start(alg)
  n = np.asarray(data.n_train, np.float64)
  x, m, c = _reference(
    model,
    data,
    x0,
    np.zeros(data.num_clients, int),
    3,
    key,
    cohort_size=4,
    corrected=method is mime,
    momentum=rho,
    eta_g=eta_g,
    weights=n if weighting == "examples" else np.ones_like(n),
    steps=sched.num_steps(np.asarray(data.n_train)),
  )
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(_trace(state), 0), m[0], atol=2e-4)
  if method is mime:
    ref.close(ref.row(state.server_state.variate, 0), c[0], atol=2e-4)


@pytest.mark.slow  # ~50 s on the loaded 2-core machine; the flat loops above stay in the default run
def test_mime_on_a_tree_keeps_the_statistics_at_the_clients_parents(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)
  rho = 0.5
  alg = mime(
    model=model,
    data=data,
    topology=topo,
    local_optimizer=optax.sgd(LR, momentum=rho),
    schedule=LocalSchedule(batch_size=B, steps=3),
    cohort_size=2,
    periods=(2,),
  )
  key = jax.random.key(4)
  state, _ = ref.run_jit(alg, data, 4, key)
  x0 = ref.start(alg)
  ones = np.ones(data.num_clients)
  x, m, _ = _reference(
    model,
    data,
    x0,
    topo.parent(2),
    4,
    key,
    cohort_size=2,
    corrected=True,
    momentum=rho,
    eta_g=1.0,
    weights=ones,
    steps=np.full(data.num_clients, 3),
    root_period=2,
  )
  for g in range(3):
    ref.close(ref.row(state.params[1], g), x[g])
    ref.close(ref.row(_trace(state), g), m[g], atol=2e-4)
  ref.close(ref.row(state.params[0], 0), x[0])


def test_without_momentum_mimelite_is_fedavg_and_so_is_mime_with_one_full_batch_step(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), cohort_size=4)
  few = LocalSchedule(batch_size=B, steps=3)
  a, _ = ref.run_jit(mimelite(schedule=few, **common), data, 2, jax.random.key(2))
  b, _ = ref.run_jit(fedavg(schedule=few, weighting="uniform", **common), data, 2, jax.random.key(2))
  ref.close(a.params[0], b.params[0], atol=1e-6)
  # SVRG's correction: not FedAvg
  c, _ = ref.run_jit(mime(schedule=few, **common), data, 2, jax.random.key(2))
  assert not np.allclose(
    np.asarray(jax.tree.leaves(c.params[0])[0]), np.asarray(jax.tree.leaves(b.params[0])[0])
  )
  full = LocalSchedule(batch_size=16, steps=1)  # the whole data in one batch: the correction is 0
  e, _ = ref.run_jit(mime(schedule=full, **common), data, 2, jax.random.key(2))
  f, _ = ref.run_jit(fedavg(schedule=full, weighting="uniform", **common), data, 2, jax.random.key(2))
  ref.close(e.params[0], f.params[0], atol=1e-6)


def test_bytes_count_the_gradient_the_statistics_and_the_variate(problem):
  data, _, model = problem
  size = sum(int(np.prod(np.shape(p))) * 4 for p in jax.tree.leaves(model.init(jax.random.key(0))))
  common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=B, steps=1), cohort_size=3)
  for method, opt, up, down in [
    (mimelite, optax.sgd(LR), 2, 1),
    (mimelite, optax.sgd(LR, momentum=0.9), 2, 2),
    (mime, optax.sgd(LR, momentum=0.9), 2, 3),
  ]:
    _, m = ref.run_jit(method(local_optimizer=opt, **common), data, 1, jax.random.key(0))
    assert (float(m["uplink_bytes"]), float(m["downlink_bytes"])) == (up * size, down * size), method.__name__


@pytest.mark.slow
def test_delta_clip_norm_bounds_every_update_and_systems_compose(problem):
  from fedtree.toolbox.systems import Systems, deadline, make_profile

  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(1.0, momentum=0.9),
    schedule=LocalSchedule(batch_size=B, steps=3),
    cohort_size=4,
  )
  alg = mimelite(delta_clip_norm=0.01, **common)
  s0 = alg.init(jax.random.key(7))
  s1, _ = jax.jit(alg.round)(s0, data, jax.random.key(1))
  moved = np.sqrt(
    sum(
      np.sum((np.asarray(a) - np.asarray(b)) ** 2)
      for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s0.params), strict=True)
    )
  )
  assert 0 < moved <= 0.01 + 1e-6
  systems = Systems(
    profile=make_profile(np.linspace(0.5, 4, data.num_clients), np.full(data.num_clients, 1e6)),
    policy=deadline(1.0, partial=True),
  )
  s, m = ref.run_jit(mime(systems=systems, **common), data, 2, jax.random.key(0))
  assert "round_seconds" in m and all(
    np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(s.server_state)
  )



@pytest.mark.parametrize("what", ["median", "joint clip"])
def test_mimelite_sends_its_gradient_through_the_updates_path(problem, what):
  """Issue 55: MimeLite's full-batch gradients take the update's robust rule (the median of the
  ``g_i`` moves the statistics) or its client stage (one clip over the pair ``(x − y_i, g_i)``, as
  local and central DP clip): Algorithm 1 with the same rule on both."""
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  rho, c = 0.9, 0.2
  path = UpdatePath(aggregator=median()) if what == "median" else UpdatePath(client=clip(c))
  alg = mimelite(model=model, data=data, local_optimizer=optax.sgd(LR, momentum=rho), schedule=sched,
                 cohort_size=5, chunk_size=2, update_paths=path)
  key = jax.random.key(11)
  state, metrics = ref.run_jit(alg, data, 3, key)
  if what != "median":
    assert float(metrics["dp_unclipped"]) < 1.0   # the clip bites
  med = lambda trees: jax.tree.map(lambda *a: np.median(np.stack(a), axis=0), *trees)   # noqa: E731
  n = np.asarray(data.n_train, np.float64)
  x, m, _ = _reference(model, data, ref.start(alg), np.zeros(data.num_clients, int), 3, key, cohort_size=5,
                       corrected=False, momentum=rho, eta_g=1.0, weights=np.ones_like(n),
                       steps=sched.num_steps(np.asarray(data.n_train)),
                       combine=med if what == "median" else None,
                       transform=None if what == "median" else clipped(c))
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(_trace(state), 0), m[0], atol=2e-4)


def test_mime_refusals(problem):
  data, _, model = problem
  common = dict(
    model=model, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=1)
  )
  with pytest.raises(ValueError, match=r"mimelite: weighting='examples' with an update path's robust "
                                       r"aggregator .* weighted a second time; use weighting='uniform'"):
    mimelite(update_paths=UpdatePath(client=clip(1.0)), weighting="examples", **common)
  mimelite(update_paths=UpdatePath(client=clip(1.0)), **common)   # uniform (the default): runs
  for method in (mime, mimelite):
    name = method.__name__
    if method is mime:   # its gradients are sent before training, beside the update
      with pytest.raises(
        ValueError,
        match=r"mime: the update path's client transform 'dp_clip' at the clients' "
        r"tier: the clients' full-batch gradients travel beside the update",
      ):
        method(update_paths=UpdatePath(client=clip(1.0)), **common)
      with pytest.raises(ValueError, match=r"node transform 'dp' at the clients' tier"):
        method(update_paths=UpdatePath(node=central(1.0, 1.0)), **common)
      with pytest.raises(ValueError, match=r"client transform 'compression'"):
        method(update_paths=UpdatePath(client=uplink(qsgd(bits=4))), **common)
      with pytest.raises(ValueError, match=r"robust .* aggregator .* full-batch gradients, sent before"):
        method(update_paths=UpdatePath(aggregator=median()), cohort_size=4, **common)
    with pytest.raises(ValueError, match="personal parameters are not supported"):
      method(personal=personal("Dense_1"), **common)
    with pytest.raises(ValueError, match=rf"{name}: server_learning_rate=0.0 must be a finite number > 0"):
      method(server_learning_rate=0.0, **common)
    with pytest.raises(ValueError, match=rf"{name}: delta_clip_norm=-1.0 must be a finite number > 0"):
      method(delta_clip_norm=-1.0, **common)
    with pytest.raises(ValueError, match=rf"{name}: needs local_optimizer="):
      method(**{**common, "local_optimizer": None})


@pytest.mark.slow
def test_a_batchnorm_model_trains_its_statistics_under_mimelite(problem):
  data, _, _ = problem
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  alg = mimelite(model=bn, data=data, local_optimizer=optax.sgd(LR, momentum=0.9),
                 schedule=LocalSchedule(batch_size=B, steps=2), cohort_size=4)
  s0 = alg.init(jax.random.key(7))
  s1, _ = jax.jit(alg.round)(s0, data, jax.random.key(1))
  before, after = s0.params[0]["batch_stats"], s1.params[0]["batch_stats"]
  assert not np.allclose(np.asarray(jax.tree.leaves(before)[0]), np.asarray(jax.tree.leaves(after)[0]))
  assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(s1))
  assert all(np.all(np.asarray(a) == 0) for a in jax.tree.leaves(_trace(s1)["batch_stats"]))
