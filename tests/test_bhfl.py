"""B-HFL (paper 001): HierFAVG reduction, per-node reference loop, evaluation by level, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import close, count_traces

from fedtree.algorithms.hierarchical.bhfl.asynchrony import Latency
from fedtree.algorithms.hierarchical.bhfl.bhfl import bhfl, level_table, proxy_from_clients
from fedtree.algorithms.host.hierfavg import hierfavg
from fedtree.core.data import as_device, from_client_arrays
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.models import build_model

SIZES = [[3, 2], [2]]   # root -> 2 regions -> 3 edges -> 7 clients


def _data(num_clients, dim=4, classes=3, seed=0):
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in range(num_clients):
    n = int(rng.integers(4, 9))
    x = rng.normal(size=(n + 3, dim)).astype(np.float32) + c % 3
    y = rng.integers(0, classes, n + 3).astype(np.int32)
    train.append((x[:n], y[:n]))
    test.append((x[n:], y[n:]))
  return as_device(from_client_arrays(train, test, num_classes=classes))


def _setup():
  topo = Topology.from_sizes(SIZES)
  data = _data(topo.num_clients)
  model = build_model("mlp", example_shape=(4,), num_classes=3, hidden=(5,))
  return topo, data, model


@pytest.mark.parametrize("cohort,periods", [(None, (3, 1)), ([2, 1, 1], (4, 2))])
def test_reduces_to_hierfavg(cohort, periods):
  """η↓ = 1 SGD down, FedAvg up, no proxy, no residuals, synchronous: HierFAVG.

  Equal to float rounding: HierFAVG's tier sums its clients in chunks sorted by step count,
  B-HFL's edges sum their arrived updates in client order."""
  topo, data, model = _setup()
  common = dict(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
                schedule=LocalSchedule(batch_size=3, epochs=1.0), cohort_size=cohort)
  ref = hierfavg(periods=periods, **common)
  alg = bhfl(periods=periods + (1,), up_optimizers=optax.sgd(1.0), down_optimizers=optax.sgd(1.0),
             **common)
  s_ref, s = ref.init(jax.random.key(0)), alg.init(jax.random.key(0))
  step_ref, step = jax.jit(ref.round), jax.jit(alg.round)
  for t in range(7):
    k = jax.random.fold_in(jax.random.key(1), t)
    s_ref, m_ref = step_ref(s_ref, data, k)
    s, m = step(s, data, k)
    for lv in range(topo.depth):
      close(s.params[lv], s_ref.params[lv], tol=1e-6)
    np.testing.assert_allclose(m["train_loss"], m_ref["train_loss"], rtol=1e-6)
  # clients hold their edge's model after the full-replacement down phase
  close(s.params[3], jax.tree.map(lambda p: p[topo.parent(3)], s.params[2]))


def _pair(**kw):
  """The vectorized algorithm and the per-node reference with the same settings."""
  from reference_bhfl import ReferenceBHFL

  from fedtree.core.sampling import cohort_sampler

  topo, data, model = _setup()
  d = topo.depth
  cohort = kw.pop("cohort", [2, 1, 1])
  sched = LocalSchedule(batch_size=3, epochs=1.0)
  up = kw.pop("up", (optax.adam(0.05), optax.sgd(0.8, momentum=0.5), optax.sgd(1.0)))
  down = kw.pop("down", (optax.sgd(0.7), optax.adam(0.1), optax.sgd(0.5)))
  proxy = kw.pop("proxy", {})
  proxy = {lv: proxy_from_clients(data, topo, lv, n, seed=lv) for lv, n in proxy.items()}
  lats = kw.pop("latencies", (Latency(),) * d)
  buffers = kw.pop("buffers", (None,) * d)
  edge_combine, received = kw.pop("edge_combine", None), kw.pop("received", None)
  alg = bhfl(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
             schedule=sched, up_optimizers=up, down_optimizers=down, cohort_size=cohort,
             proxy=proxy, proxy_schedule=LocalSchedule(batch_size=4, epochs=None, steps=2),
             latencies=lats, buffer_sizes=buffers, **kw)
  from fedtree.algorithms.hierarchical.bhfl.bhfl import check_node_periods

  ref = ReferenceBHFL(
    model=model, topology=topo, schedule=sched, local_opt=optax.sgd(0.1), up_opts=up,
    down_opts=down, periods=check_node_periods(kw.get("periods"), topo),
    sampler=cohort_sampler(topo.parent(d), cohort), weighting="examples", buffers=buffers,
    latencies=lats, exponent=kw.get("staleness_exponent", 0.0), proxy=proxy,
    proxy_opt=optax.sgd(0.1), proxy_sched=LocalSchedule(batch_size=4, epochs=None, steps=2),
    residual_k=kw.get("residual_k", 0), residual_opt=kw.get("residual_optimizer") or optax.sgd(1.0),
    residual_down=kw.get("residual_down", False),
    direct_opt=kw.get("residual_down_optimizer") or optax.sgd(0.5),
    init_params=model.init(jax.random.key(0)), edge_combine=edge_combine, received=received,
  )
  return topo, data, alg, ref


def _compare(topo, data, alg, ref, rounds):
  state = alg.init(jax.random.key(0))
  step = jax.jit(alg.round)
  metrics = []
  for t in range(rounds):
    k = jax.random.fold_in(jax.random.key(3), t)
    state, m = step(state, data, k)
    ref.round_(k, data)
    metrics.append(m)
    for lv in range(topo.depth + 1):
      close(state.params[lv], ref.stacked(lv), tol=2e-5)
  return state, metrics


def test_sync_matches_per_node_loop_with_everything_on():
  topo, data, alg, ref = _pair(
    periods=(2, [2, 1], 1), proxy={0: 6, 1: 5}, residual_k=1,
    residual_optimizer=optax.sgd(0.3), residual_down=True,
  )
  state, metrics = _compare(topo, data, alg, ref, rounds=4)
  assert int(metrics[1]["residual_links_used"]) == 3
  assert int(metrics[0]["aggregated_l0"]) == 0 and int(metrics[1]["aggregated_l0"]) == 1
  assert int(metrics[0]["aggregated_l1"]) == 1  # node 0 of level 1 has period 2


@pytest.mark.parametrize("cohort,buffers", [([2, 1, 1], (1, 1, 1)), ([2, 2, 2], (None, 1, 2))])
def test_async_matches_per_node_loop(cohort, buffers):
  topo, data, alg, ref = _pair(
    latencies=(Latency("uniform", low=0.0, high=1.5), Latency("constant", mean=0.4),
               Latency("exponential", mean=0.7)),
    buffers=buffers, staleness_exponent=0.5, residual_k=1, cohort=cohort,
  )
  state, metrics = _compare(topo, data, alg, ref, rounds=6)
  stale = sum(float(m[f"staleness_l{lv}"]) for m in metrics for lv in range(3))
  assert stale > 0, "this setting should produce stale updates"


def test_round_compiles_once_and_models_by_level():
  from fedtree.core import loop

  topo, data, model = _setup()
  alg = bhfl(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
             schedule=LocalSchedule(batch_size=3, epochs=1.0), cohort_size=1, periods=(2, 2, 1),
             down_optimizers=optax.sgd(0.5), residual_k=1, buffer_sizes=(None, 1, 1),
             latencies=Latency("exponential", mean=0.5),
             proxy={0: proxy_from_clients(data, topo, 0, 5)})
  counted, traces = count_traces(alg)
  state = alg.init(jax.random.key(0))
  step = loop.compile_rounds(counted, 3)
  for _ in range(3):
    state, metrics = step(state, data, jax.random.key(0))
  assert len(traces) == 1 and int(state.round) == 9
  assert np.all(np.isfinite(np.asarray(metrics["train_loss"])))
  models = alg.models(state)
  assert list(models) == ["root", "level1", "level2", "client"]
  np.testing.assert_array_equal(models["level1"].model_of_client, topo.ancestor(1))
  np.testing.assert_array_equal(models["client"].model_of_client, np.arange(topo.num_clients))


def test_level_table_scores_every_node_on_its_subtree_and_on_the_central_set():
  topo, data, model = _setup()
  keys = jax.random.split(jax.random.key(0), topo.num_clients)
  client = jax.vmap(model.init)(keys)                       # distinct models everywhere
  sizes = [topo.num_nodes(lv) for lv in range(topo.depth + 1)]
  by_level = [jax.tree.map(lambda p, n=n: p[:n], client) for n in sizes]
  rows = level_table(model, by_level, topo, data)
  assert [r["nodes"] for r in rows] == [1, 2, 3, 7]
  x, y, n = (np.asarray(a) for a in (data.x_test, data.y_test, data.n_test))
  for lv, r in enumerate(rows):
    anc = topo.ancestor(lv)
    correct = total = 0
    for c in range(topo.num_clients):                       # per-client loop reference
      p = jax.tree.map(lambda a, m=anc[c]: a[m], by_level[lv])
      logits = model.apply(p, jnp.asarray(x[c, : n[c]]))
      correct += int(np.sum(np.argmax(np.asarray(logits), -1) == y[c, : n[c]]))
      total += int(n[c])
    assert r["subtree_accuracy"] == pytest.approx(correct / total)
    xc = np.concatenate([x[c, : n[c]] for c in range(topo.num_clients)])
    yc = np.concatenate([y[c, : n[c]] for c in range(topo.num_clients)])
    accs = []
    for node in range(topo.num_nodes(lv)):
      p = jax.tree.map(lambda a, node=node: a[node], by_level[lv])
      accs.append(np.mean(np.argmax(np.asarray(model.apply(p, jnp.asarray(xc))), -1) == yc))
    assert r["central_accuracy"] == pytest.approx(np.mean(accs))
    assert r["central_min"] == pytest.approx(np.min(accs))


def test_clear_errors_for_periods_buffers_and_k():
  topo, data, model = _setup()
  kw = dict(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
            schedule=LocalSchedule(batch_size=3, epochs=1.0))
  with pytest.raises(ValueError, match="3 server levels"):
    bhfl(periods=(2, 1), **kw)
  with pytest.raises(ValueError, match="periods\\[1\\] has 3 entries for the 2 nodes"):
    bhfl(periods=(1, (1, 2, 2), 1), **kw)
  with pytest.raises(ValueError, match="must be >= 1"):
    bhfl(periods=(0, 1, 1), **kw)
  with pytest.raises(ValueError, match="buffer_sizes\\[1\\]=3 cannot work"):
    bhfl(buffer_sizes=(None, 3, None), **kw)          # a region has only 1 edge
  with pytest.raises(ValueError, match="buffer_sizes\\[2\\]=2 cannot work"):
    bhfl(buffer_sizes=(None, None, 2), cohort_size=1, **kw)
  with pytest.raises(ValueError, match="residual_k=3 cannot work"):
    bhfl(residual_k=3, **kw)                         # the smallest edge has 2 clients
  with pytest.raises(ValueError, match="residual_k=2 cannot work"):
    bhfl(residual_k=2, buffer_sizes=(None, None, 1), **kw)
  with pytest.raises(ValueError, match="depth >= 3"):
    flat2 = Topology.from_labels([0, 0, 0, 1, 1, 2, 2])
    bhfl(**dict(kw, topology=flat2), residual_down=True)
  with pytest.raises(ValueError, match="proxy data at level 3"):
    bhfl(proxy={3: proxy_from_clients(data, topo, 0, 4)}, **kw)
  with pytest.raises(ValueError, match="latency kind"):
    Latency("gamma")


def test_persistent_clients_keep_their_own_models_with_partial_merges():
  topo, data, model = _setup()
  alg = bhfl(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
             schedule=LocalSchedule(batch_size=3, epochs=1.0), cohort_size=1,
             down_optimizers=optax.sgd(0.5))
  state, step = alg.init(jax.random.key(0)), jax.jit(alg.round)
  for t in range(3):
    state, _ = step(state, data, jax.random.key(t))
  clients = state.params[3]
  edges = jax.tree.map(lambda p: p[topo.parent(3)], state.params[2])
  diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), clients, edges)
  assert max(jax.tree.leaves(diff)) > 1e-4          # η↓ = 0.5: clients stay personal


def test_level_report_reuses_the_runs_evaluation_of_the_levels():
  """The report's subtree columns are the run's own summaries of B-HFL's models (no second
  scoring), and equal what the table scores itself; only the central set is scored."""
  from fedtree import evaluation
  from fedtree.algorithms.hierarchical.bhfl.bhfl import level_name

  topo, data, model = _setup()
  alg = bhfl(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
             schedule=LocalSchedule(batch_size=3, steps=2), down_optimizers=optax.sgd(0.5))
  state = alg.init(jax.random.key(0))
  state, _ = jax.jit(alg.round)(state, data, jax.random.key(1))
  summaries = evaluation.evaluate_models(alg, state, model, data)
  scored = level_table(model, state.params, topo, data)
  reused = level_table(model, state.params, topo, data, summaries=summaries)
  for a, b in zip(scored, reused, strict=True):  # the table's own sums are float32, the run's float64
    assert a["subtree_accuracy"] == pytest.approx(b["subtree_accuracy"], rel=1e-6)
    assert a["subtree_client_mean"] == pytest.approx(b["subtree_client_mean"], rel=1e-6)
    assert a["central_accuracy"] == b["central_accuracy"]
  fake = {level_name(lv, topo.depth): {"accuracy": 0.25, "client_mean_accuracy": 0.5}
          for lv in range(topo.depth + 1)}
  rows = level_table(model, state.params, topo, data, summaries=fake)
  assert all(r["subtree_accuracy"] == 0.25 and r["subtree_client_mean"] == 0.5 for r in rows)


def _median(updates, weights):
  """An edge's coordinate-wise median of the updates it takes (unweighted, as the aggregator's)."""
  return jax.tree.map(lambda *a: jnp.asarray(np.median(np.stack([np.asarray(x) for x in a]), axis=0)),
                      *updates)


@pytest.mark.parametrize("cohort,buffers", [([2, 2, 2], (None, None, None)), ([2, 2, 2], (None, 1, 2))])
def test_a_robust_aggregator_at_the_edges_takes_what_each_edge_takes_from_its_buffer(cohort, buffers):
  """Issue 55: the median at B-HFL's edge servers, over the updates each edge takes from its buffer
  (asynchronous, stale ones included), against the per-node loop with the median at the edges."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import robust

  topo, data, alg, ref = _pair(
    latencies=(Latency("uniform", low=0.0, high=1.5), Latency("constant", mean=0.4),
               Latency("exponential", mean=0.7)),
    buffers=buffers, staleness_exponent=0.5, cohort=cohort,
    update_paths=UpdatePath(aggregator=robust.median()), edge_combine=_median)
  _compare(topo, data, alg, ref, rounds=4)


def test_a_compressed_downlink_reaches_the_clients_through_their_down_merge():
  """Issue 55: the edges send their clients float16 models, which the clients merge through their
  down optimizer; the clients' downlink counts 2 bytes a coordinate."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import compression

  half = lambda m: jax.tree.map(lambda a: jnp.asarray(a, jnp.float16).astype(a.dtype), m)   # noqa: E731
  topo, data, alg, ref = _pair(update_paths=UpdatePath(down=compression.downlink(compression.fp16())),
                               received=half)
  state, metrics = _compare(topo, data, alg, ref, rounds=3)
  size = sum(np.size(a) for a in jax.tree.leaves(ref.params[0][0]))
  assert int(metrics[-1]["downlink_bytes"]) == 2 * size


def test_central_noise_at_the_edges_is_refused_by_name():
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import privacy as dp

  with pytest.raises(ValueError, match=r"bhfl: central differential privacy \('dp'\) at the edge servers: .* "
                                       r"staleness"):
    _pair(update_paths=UpdatePath(client=dp.clip(0.5), node=dp.central(0.5, 0.5)))
