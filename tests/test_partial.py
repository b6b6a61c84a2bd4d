"""Partial personalization (issue 37): FedPer, FedRep, LG-FedAvg, FedBN, FedRoD, FedBABU and local
training against plain per-client loops written from the papers (tests/reference_personalization.py),
their reductions (an empty personal set is FedAvg, every parameter personal is local training,
FedBABU without fine-tuning is FedAvg with a frozen head, FedRoD's generic model without the balanced
loss is FedAvg's), FedBN's statistics never leaving a client, the trees, the fine-tune before
evaluation (X + FT), and the refusals."""

import zlib

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import reference_personalization as ref
from helpers import small_context

from fedtree.algorithms import (
  fedavg,
  fedbabu,
  fedbn,
  fedper,
  fedrep,
  fedrod,
  finetuned,
  hierfavg,
  lgfedavg,
  local,
)
from fedtree.core import loop
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule, sgd_client_update, train_only
from fedtree.core.personal import Personal, personal
from fedtree.core.rng import stream
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model

LR, B, STEPS, ROUNDS = 0.1, 4, 2, 3


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=3, max_examples=14, test_examples=5, seed=3)
  return as_device(data), groups


def _mlp(data, norm="none"):
  return build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm=norm)


def _common(model, data, **kw):
  return dict(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
              schedule=LocalSchedule(batch_size=B, steps=STEPS), cohort_size=3, **kw)


def _run(alg, data, rounds=ROUNDS, key=None):
  key = jax.random.key(5) if key is None else key
  state = alg.init(jax.random.key(7))
  step = jax.jit(alg.round)
  metrics = None
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


def _start(alg):
  return jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])


def _row(tree, i):
  return jax.tree.map(lambda a: np.asarray(a[i], np.float64), tree)


def _close(a, b, atol=3e-5):
  chex.assert_trees_all_close(jax.tree.map(lambda x: np.asarray(x, np.float64), a),
                              jax.tree.map(lambda x: np.asarray(x, np.float64), b), atol=atol, rtol=2e-4)


def _head(params, layer="Dense_1"):
  return ref.flags(params, lambda p: p.split("/")[-2] == layer)


def _check_personal(alg, state, server, own, keep, num_clients):
  models = alg.models(state)
  assert set(models) == {"personal"}
  for c in range(num_clients):
    _close(_row(models["personal"].params, c), ref.own_model(server, own[c], keep))


def _plain_client(model, data, steps=STEPS, trainable=None):
  def client(params, c, rk):
    return ref.sgd_steps(model, params, ref.client_cdata(data, c), steps,
                         jax.random.fold_in(stream(rk, "train"), c), lr=LR, batch_size=B, trainable=trainable)
  return client


# ------------------------------------------------------------------------ against the per-client loops
def test_fedper_matches_a_per_client_loop(problem):
  data, _ = problem
  model = _mlp(data)
  alg = fedper(**_common(model, data))
  state, metrics = _run(alg, data)
  start = _start(alg)
  keep = _head(start)
  server, own = ref.partial_rounds(model, data, start, ROUNDS, jax.random.key(5), keep=keep,
                                   client=_plain_client(model, data), cohort_size=3)
  _close(_row(state.params[0], 0), server)
  _check_personal(alg, state, server, own, keep, data.num_clients)
  body = sum(int(np.prod(a.shape)) * 4 for a in jax.tree.leaves(start["Dense_0"]))
  assert float(metrics["uplink_bytes"]) == float(metrics["downlink_bytes"]) == body   # the head is never sent


@pytest.mark.parametrize("head_steps,head_epochs",
                         [(3, None), pytest.param(None, 1.0, marks=pytest.mark.slow)])
def test_fedrep_matches_a_per_client_loop(problem, head_steps, head_epochs):
  data, _ = problem
  model = _mlp(data)
  alg = fedrep(head_steps=head_steps, head_epochs=head_epochs, **_common(model, data))
  state, _ = _run(alg, data)
  start = _start(alg)
  keep = _head(start)
  n = np.asarray(data.n_train)
  heads = np.full(data.num_clients, head_steps) if head_steps is not None else -(-n // B)

  def client(params, c, rk):
    return ref.fedrep_client(model, params, keep, ref.client_cdata(data, c), heads[c], STEPS,
                             jax.random.fold_in(stream(rk, "train"), c), lr=LR, batch_size=B)

  server, own = ref.partial_rounds(model, data, start, ROUNDS, jax.random.key(5), keep=keep, client=client,
                                   cohort_size=3, weighting="uniform")
  _close(_row(state.params[0], 0), server)
  _check_personal(alg, state, server, own, keep, data.num_clients)


def test_lgfedavg_matches_a_per_client_loop(problem):
  data, _ = problem
  model = _mlp(data)
  alg = lgfedavg(**_common(model, data))
  state, metrics = _run(alg, data)
  start = _start(alg)
  keep = [not h for h in _head(start)]   # the local representation
  server, own = ref.partial_rounds(model, data, start, ROUNDS, jax.random.key(5), keep=keep,
                                   client=_plain_client(model, data), cohort_size=3)
  _close(_row(state.params[0], 0)["Dense_1"], server["Dense_1"])
  _check_personal(alg, state, server, own, keep, data.num_clients)
  head = sum(int(np.prod(a.shape)) * 4 for a in jax.tree.leaves(start["Dense_1"]))
  assert float(metrics["uplink_bytes"]) == head


def test_fedbn_matches_a_per_client_loop_and_statistics_never_leave_a_client(problem):
  data, _ = problem
  model = _mlp(data, norm="batch")
  alg = fedbn(**_common(model, data))
  state, metrics = _run(alg, data)
  start = _start(alg)
  keep = ref.flags(start, lambda p: "BatchNorm" in p)
  assert sum(keep) == 4   # scale, bias, mean, var
  server, own = ref.partial_rounds(model, data, start, ROUNDS, jax.random.key(5), keep=keep,
                                   client=_plain_client(model, data), cohort_size=3)
  _close(_row(state.params[0], 0), server)
  _check_personal(alg, state, server, own, keep, data.num_clients)
  # the aggregated state: the server's BatchNorm layers are bitwise their initial values
  chex.assert_trees_all_equal(state.params[0]["batch_stats"],
                              jax.tree.map(lambda a: a[None], start["batch_stats"]))
  chex.assert_trees_all_equal(state.params[0]["params"]["BatchNorm_0"],
                              jax.tree.map(lambda a: a[None], start["params"]["BatchNorm_0"]))
  # the bytes: what a client sends and receives is the Dense layers alone
  dense = sum(int(np.prod(a.shape)) * 4
              for p, a in zip(ref.paths_of(start), jax.tree.leaves(start), strict=True) if "Dense" in p)
  assert float(metrics["uplink_bytes"]) == float(metrics["downlink_bytes"]) == dense
  # and each client's statistics are its own
  means = np.asarray(alg.models(state)["personal"].params["batch_stats"]["BatchNorm_0"]["mean"])
  trained = [c for c in range(data.num_clients) if not np.allclose(means[c], 0)]
  assert len({tuple(np.round(means[c], 6)) for c in trained}) == len(trained) > 1


@pytest.mark.slow
@pytest.mark.parametrize("affine,statistics", [(True, False), (False, True)])
def test_fedbn_affine_and_statistics_options(problem, affine, statistics):
  data, _ = problem
  model = _mlp(data, norm="batch")
  alg = fedbn(affine=affine, statistics=statistics, **_common(model, data))
  state, _ = _run(alg, data, rounds=2)
  start = alg.init(jax.random.key(7)).params[0]
  stats_moved = not np.allclose(state.params[0]["batch_stats"]["BatchNorm_0"]["mean"],
                                start["batch_stats"]["BatchNorm_0"]["mean"])
  affine_moved = not np.allclose(state.params[0]["params"]["BatchNorm_0"]["scale"],
                                 start["params"]["BatchNorm_0"]["scale"])
  assert stats_moved == (not statistics) and affine_moved == (not affine)


def test_fedrod_matches_a_per_client_loop(problem):
  data, _ = problem
  model = _mlp(data)
  alg = fedrod(**_common(model, data))
  state, _ = _run(alg, data)
  start = _start(alg)
  head = _head(start)
  heads = {c: [np.asarray(a) for a, h in zip(jax.tree.leaves(start), head, strict=True) if h]
           for c in range(data.num_clients)}   # a copy of the initial generic head

  def client(params, c, rk):
    p, heads[c] = ref.fedrod_client(model, params, heads[c], head, ref.client_cdata(data, c), STEPS,
                                    jax.random.fold_in(stream(rk, "train"), c), lr=LR, batch_size=B,
                                    num_classes=3)
    return p

  nothing = [False] * len(head)
  server, _ = ref.partial_rounds(model, data, start, ROUNDS, jax.random.key(5), keep=nothing, client=client,
                                 cohort_size=3)
  _close(_row(state.params[0], 0), server)
  models = alg.models(state)
  assert set(models) == {"global", "personal"}
  for c in range(data.num_clients):
    it = iter(heads[c])
    mine = jax.tree.unflatten(jax.tree.structure(server), [
      w + next(it) if h else w for w, h in zip(jax.tree.leaves(server), head, strict=True)])
    _close(_row(models["personal"].params, c), mine)
    _close(jax.tree.leaves(_row(state.client_state, c)), heads[c])


def test_fedbabu_matches_a_per_client_loop_with_its_fine_tune(problem):
  data, _ = problem
  model = _mlp(data)
  alg = fedbabu(finetune_epochs=0, finetune_steps=3, **_common(model, data))
  state, metrics = _run(alg, data)
  start = _start(alg)
  head = _head(start)
  body = [not h for h in head]
  server, _ = ref.partial_rounds(model, data, start, ROUNDS, jax.random.key(5), keep=head,
                                 client=_plain_client(model, data, trainable=body), cohort_size=3)
  _close(_row(state.params[0], 0), server)
  chex.assert_trees_all_equal(state.params[0]["Dense_1"], jax.tree.map(lambda a: a[None], start["Dense_1"]))
  body_bytes = sum(int(np.prod(a.shape)) * 4 for a in jax.tree.leaves(start["Dense_0"]))
  assert float(metrics["uplink_bytes"]) == body_bytes   # the frozen head is never sent
  # every client fine-tunes the global model for 3 steps of SGD (the finetuner's keys)
  models = alg.models(state)
  assert set(models) == {"global", "global_ft"}
  key = jax.random.fold_in(jax.random.fold_in(stream(jax.random.key(0), "finetune"), ROUNDS),
                           zlib.crc32(b"global") & 0x7FFFFFFF)
  glob = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), server)
  for c in range(data.num_clients):
    tuned = ref.sgd_steps(model, glob, ref.client_cdata(data, c), 3, jax.random.fold_in(key, c), lr=LR,
                          batch_size=B)
    _close(_row(models["global_ft"].params, c), tuned)


# ------------------------------------------------------------------------ the head
def test_the_head_is_the_last_layers_in_forward_order():
  """``head=k`` counts layers in the order the model creates them (not the sorted order of the
  params' keys, where Dense_10 comes before Dense_2), anchored (Dense_1 does not match Dense_10),
  also for a float64 model; a BatchNorm head layer takes its statistics along."""
  from fedtree.algorithms.partial.split import head_patterns, mask_of
  from fedtree.core.model import layer_order
  from fedtree.experiment.runner import as_float64

  data, _ = grouped_synthetic(group_sizes=(2,), dim=4, num_classes=3, seed=0)
  deep = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(3,) * 11)
  assert layer_order(deep)[-3:] == ("Dense_9", "Dense_10", "Dense_11")
  with jax.enable_x64(True):
    _, _, deep64 = as_float64(data, None, deep)
    assert layer_order(deep64) == layer_order(deep)
  template = jax.eval_shape(deep.init, jax.random.key(0))
  mask = mask_of(head_patterns(deep, 2, algorithm="t"), template, algorithm="t")
  assert [p for p, m in zip(ref.paths_of(template), jax.tree.leaves(mask), strict=True) if m] == [
    "Dense_10/bias", "Dense_10/kernel", "Dense_11/bias", "Dense_11/kernel"]
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(3,), norm="batch")
  template = jax.eval_shape(bn.init, jax.random.key(0))
  mask = mask_of(head_patterns(bn, 2, algorithm="t"), template, algorithm="t")
  assert [p for p, m in zip(ref.paths_of(template), jax.tree.leaves(mask), strict=True) if m] == [
    "batch_stats/BatchNorm_0/mean", "batch_stats/BatchNorm_0/var", "params/BatchNorm_0/bias",
    "params/BatchNorm_0/scale", "params/Dense_1/bias", "params/Dense_1/kernel"]


# ------------------------------------------------------------------------ reductions
@pytest.mark.slow   # (test_seams.py's test_no_personal_parameters_is_bitwise_the_host is its fast sibling)
def test_an_empty_personal_set_is_fedavg(problem):
  data, _ = problem
  common = _common(_mlp(data), data)
  a, _ = _run(fedavg(**common), data, rounds=2)
  b, _ = _run(fedavg(personal=Personal(patterns=()), **common), data, rounds=2)
  chex.assert_trees_all_equal(a.params, b.params)


def test_every_parameter_personal_is_local_training(problem):
  data, _ = problem
  model = _mlp(data)
  alg = local(**{**_common(model, data), "cohort_size": None})
  state, metrics = _run(alg, data, rounds=2)
  assert float(metrics["uplink_bytes"]) == float(metrics["downlink_bytes"]) == 0
  start = _start(alg)
  own = alg.models(state)["personal"].params
  for c in range(data.num_clients):
    p = start
    for r in range(2):
      rk = jax.random.fold_in(jax.random.key(5), r)
      p = ref.sgd_steps(model, p, ref.client_cdata(data, c), STEPS,
                        jax.random.fold_in(stream(rk, "train"), c), lr=LR, batch_size=B)
    _close(_row(own, c), p)
  chex.assert_trees_all_equal(state.params[0], alg.init(jax.random.key(7)).params[0])   # no server moves


def test_fedbabu_without_fine_tuning_is_fedavg_with_a_frozen_head(problem):
  data, _ = problem
  model = _mlp(data)
  common = _common(model, data)
  babu = fedbabu(finetune_epochs=0, finetune_steps=0, **common)
  body = jax.tree.map(lambda p: not p, {"Dense_0": {"bias": False, "kernel": False},
                                        "Dense_1": {"bias": True, "kernel": True}})

  def frozen_head(s):
    return sgd_client_update(s.model, train_only(s.optimizer, body), batch_size=s.batch_size,
                             max_steps=s.max_steps)

  plain = fedavg(client_update=frozen_head, **common)
  a, _ = _run(babu, data)
  b, _ = _run(plain, data)
  assert set(babu.models(a)) == set(plain.models(b)) == {"global"}
  _close(babu.models(a)["global"].params, plain.models(b)["global"].params, atol=1e-6)


@pytest.mark.slow   # (test_fedrod_matches_a_per_client_loop is its fast sibling)
def test_fedrod_generic_model_without_the_balanced_loss_is_fedavg(problem):
  """The personal loss never reaches the generic model (detached), so with plain cross-entropy the
  generic model is FedAvg's."""
  data, _ = problem
  common = _common(_mlp(data), data)
  a, _ = _run(fedrod(balanced=False, **common), data)
  b, _ = _run(fedavg(**common), data)
  _close(a.params, b.params, atol=1e-6)
  c, _ = _run(fedrod(**common), data)   # the balanced loss moves it
  assert not np.allclose(c.params[0]["Dense_1"]["kernel"], b.params[0]["Dense_1"]["kernel"], atol=1e-4)


# ------------------------------------------------------------------------ trees
@pytest.mark.slow   # ~50 s on the loaded 2-core machine (test_seams.py tests per-level personal parameters)
def test_on_a_tree_heads_stay_within_their_level(problem):
  data, groups = problem
  topo = Topology.from_labels(groups)
  model = _mlp(data)
  common = dict(**{**_common(model, data), "cohort_size": 2}, topology=topo, periods=(2,))
  mine, _ = _run(fedper(personal_level=1, **common), data, rounds=4)
  theirs, _ = _run(hierfavg(personal=personal("^Dense_1/", level=1), **common), data, rounds=4)
  chex.assert_trees_all_equal(mine.params, theirs.params)
  # FedRoD and FedBABU: the generic model up the tree; a client's personal model on its edge's
  rod = fedrod(**common)
  state, _ = _run(rod, data, rounds=2)
  models = rod.models(state)
  assert set(models) == {"global", "level1", "personal"}
  edge = topo.parent(2)
  for c in range(data.num_clients):
    _close(_row(models["personal"].params, c)["Dense_0"], _row(state.params[1], int(edge[c]))["Dense_0"])
  babu = fedbabu(finetune_epochs=0, finetune_steps=0, **common)
  state, _ = _run(babu, data, rounds=4)
  assert set(babu.models(state)) == {"global", "level1"}
  start = babu.init(jax.random.key(7)).params
  for lv in (0, 1):
    chex.assert_trees_all_equal(state.params[lv]["Dense_1"], start[lv]["Dense_1"])


# ------------------------------------------------------------------------ X + FT, counts
@pytest.mark.slow   # ~45 s on the loaded 2-core machine (FedBABU's fine-tune is its fast sibling)
def test_any_algorithm_fine_tuned_from_a_config(problem):
  ctx = small_context()
  run = ml_collections.ConfigDict({"algorithm": "ditto", "lam": 0.5, "finetune_steps": 2,
                                   "finetune_params": "Dense_1", "finetune_learning_rate": 0.2})
  alg = registry.build_algorithm("ditto_ft", run, ctx)
  state = loop.run(alg, ctx.data, num_rounds=1, key=jax.random.key(0), cache=None)
  models = alg.models(state)
  assert {"global", "personal", "global_ft", "personal_ft"} <= set(models)
  before, after = models["personal"].params, models["personal_ft"].params
  chex.assert_trees_all_equal(before["Dense_0"], after["Dense_0"])   # only the head was fine-tuned
  assert not np.allclose(before["Dense_1"]["kernel"], after["Dense_1"]["kernel"])
  # FedAvg + FT against the per-client loop
  data, model = ctx.data, ctx.model
  ft = finetuned(fedavg(model=model, data=data, local_optimizer=optax.sgd(LR),
                        schedule=LocalSchedule(batch_size=B, steps=1)),
                 model=model, data=data, batch_size=B, learning_rate=0.2, steps=3, seed=4)
  state = loop.run(ft, data, num_rounds=1, key=jax.random.key(0), cache=None)
  models = ft.models(state)
  key = jax.random.fold_in(jax.random.fold_in(stream(jax.random.key(4), "finetune"), 1),
                           zlib.crc32(b"global") & 0x7FFFFFFF)
  glob = jax.tree.map(lambda a: a[0], models["global"].params)
  for c in range(data.num_clients):
    tuned = ref.sgd_steps(model, glob, ref.client_cdata(data, c), 3, jax.random.fold_in(key, c), lr=0.2,
                          batch_size=B)
    _close(_row(models["global_ft"].params, c), tuned)


def test_every_method_reports_its_parameter_counts(problem):
  data, _ = problem
  model = _mlp(data)
  alg = fedper(**_common(model, data))
  state = alg.init(jax.random.key(0))
  rep = alg.report(state, data, jax.random.key(0), {"personal": {"accuracy": 0.5}})
  # Dense_0: 6*5+5 = 35 shared, Dense_1: 5*3+3 = 18 personal
  assert rep.summaries["personal"]["parameters"] == {"personal": 18, "shared": 35}
  assert "18 personal, 35 shared" in rep.text


# ------------------------------------------------------------------------ refusals
def _refused(ctx, fields, match):
  run = ml_collections.ConfigDict(fields)
  with pytest.raises(ValueError, match=match):
    registry.build_algorithm("mine", run, ctx)


def test_refusals_name_the_run_and_the_value():
  ctx = small_context()
  where = r"config\.runs\.mine \(algorithm='{}'\): "
  _refused(ctx, {"algorithm": "fedper", "head": "classifier"},
           where.format("fedper") + r"fedper: personal pattern 'classifier' matches no parameter of the "
                                    r"model; its parameters are \['Dense_0/bias")
  _refused(ctx, {"algorithm": "fedrep", "head": ".*", "head_steps": 1},
           where.format("fedrep") + "fedrep: the head covers every parameter .* leaving no body to share: "
                                    "that is local training")
  _refused(ctx, {"algorithm": "lgfedavg", "head": ".*"},
           where.format("lgfedavg") + "lgfedavg: the local representation is empty .* which is FedAvg")
  _refused(ctx, {"algorithm": "fedbabu", "finetune_steps": -1, "finetune_epochs": 0},
           where.format("fedbabu") + r"fedbabu: finetune_steps=-1 must be an int >= 0")
  _refused(ctx, {"algorithm": "fedavg", "finetune_steps": -3},
           r"config\.runs\.mine .*fedavg: finetune_steps=-3 must be an int >= 0")
  _refused(ctx, {"algorithm": "fedavg", "finetune_steps": 2, "finetune_epochs": 1.0},
           "give finetune_steps=2 or finetune_epochs=1.0, not both")
  _refused(ctx, {"algorithm": "fedrep", "head_steps": -2}, where.format("fedrep") + "fedrep: head_steps=-2")
  _refused(ctx, {"algorithm": "fedper", "head": 2}, r"fedper: head=2: the model's layers are \['Dense_0', "
                                                    r"'Dense_1'\]")
  _refused(ctx, {"algorithm": "fedbn"},
           where.format("fedbn") + "fedbn: the model keeps no BatchNorm statistics")
  _refused(ctx, {"algorithm": "fedbn", "model": {"norm": "batch"}, "affine": False, "statistics": False},
           "keep nothing local: that is FedAvg")
  _refused(ctx, {"algorithm": "fedbabu", "head_init": "zeros"}, r"head_init='zeros'; choose one of")
  _refused(ctx, {"algorithm": "fedper", "personal": {"patterns": ["Dense_1"]}},
           r"unknown field 'personal'")
  common = dict(model=ctx.model, data=ctx.data, local_optimizer=optax.sgd(LR), schedule=ctx.schedule)
  with pytest.raises(ValueError, match=r"fedper: personal= is not an option of this method"):
    fedper(personal=personal("Dense_1"), **common)
  with pytest.raises(ValueError, match="batch_order='cyclic' is not supported"):
    fedrep(**{**common, "schedule": LocalSchedule(batch_size=B, steps=1, batch_order="cyclic")})
  alg = finetuned(fedavg(**common), model=ctx.model, data=ctx.data, batch_size=B, learning_rate=0.1, steps=1,
                  models=("personal",))
  with pytest.raises(ValueError, match=r"finetune_models=\['personal'\] names \['personal'\], which this "
                                       r"algorithm does not report; its models are \['global'\]"):
    alg.models(alg.init(jax.random.key(0)))
