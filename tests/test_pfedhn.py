"""pFedHN and pFedHN-PC: the vectorized rounds against a per-client loop written from the paper
(one client a round is its Algorithm 1; a larger cohort averages the clients' hypernetwork
gradients), every client scored with its generated model, pFedHN-PC's own heads, a hypernetwork per
parent on a tree, the bytes, and the refusals."""

import chex
import jax
import ml_collections
import numpy as np
import optax
import pytest
import reference_pairwise as ref
from helpers import clipped, small_context

from fedtree.algorithms import pfedhn
from fedtree.algorithms.personalized.pfedhn import generate
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model
from fedtree.toolbox.compression import downlink, qsgd, uplink
from fedtree.toolbox.privacy import central, clip
from fedtree.toolbox.robust import median

LR, B = 0.1, 4
HN = dict(hn_learning_rate=0.05, hn_momentum=0.9, hn_weight_decay=1e-3, clip_norm=0.5)   # the clip bites


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 3), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=4, max_examples=12, test_examples=5, seed=6)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, model


def _run(alg, data, rounds, key):
  state = jax.jit(alg.init)(jax.random.key(7))
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


@pytest.mark.parametrize("cohort", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_pfedhn_matches_the_per_client_loop(problem, cohort):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, steps=3)
  alg = pfedhn(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=cohort,
               hidden=6, n_hidden=1, embed_dim=3, **HN)
  key = jax.random.key(9)
  start = jax.jit(alg.init)(jax.random.key(7)).server_state
  state, metrics = _run(alg, data, 3, key)
  template = model.init(jax.random.key(0))
  leaves, treedef = jax.tree.flatten(template)
  hnet, emb = ref.pfedhn_reference(
    model, data, jax.tree.map(lambda a: a[0], start.hnet), start.embeddings[0], treedef,
    [a.shape for a in leaves], 3, key, cohort_size=cohort, lr=LR, batch_size=B,
    steps=np.full(data.num_clients, 3), hn_lr=HN["hn_learning_rate"], momentum=HN["hn_momentum"],
    weight_decay=HN["hn_weight_decay"], clip_norm=HN["clip_norm"])
  got = ref.np64(jax.tree.map(lambda a: a[0], state.server_state.hnet))
  chex.assert_trees_all_close(got, hnet, atol=3e-5, rtol=2e-4)
  np.testing.assert_allclose(np.asarray(state.server_state.embeddings[0]), emb, atol=3e-5, rtol=2e-4)
  # every client is scored with the model the hypernetwork makes for it
  personal_models = alg.models(state)["personal"]
  for k in (0, 4):
    hn = jax.tree.map(lambda a: a[0], state.server_state.hnet)
    want = generate(hn, state.server_state.embeddings[0, k], template, None)
    chex.assert_trees_all_close(jax.tree.map(lambda a, k=k: a[k], personal_models.params), want, atol=1e-6)
  assert "uplink_bytes" not in metrics   # θ_i down, Δθ_i up: one model each way


def test_pfedhn_starts_from_given_values_and_flgos_embedding_step(problem):
  """Issue 57 item 8: the hypernetwork and the embeddings start from the values given (a reference's,
  no state surgery), and ``embedding_step="mean"`` divides the embeddings' gradients by the cohort as
  ``φ``'s (FLGo's): two rounds of two clients against the per-client loop; the run fields take the
  step, and shapes that are not the hypernetwork's are refused naming the leaf."""
  from fedtree.algorithms.personalized.pfedhn import init_hypernetwork

  data, _, model = problem
  sched = LocalSchedule(batch_size=B, steps=3)
  template = model.init(jax.random.key(0))
  hn0 = jax.tree.map(np.asarray, init_hypernetwork(jax.random.key(42), template, None, embed_dim=3, hidden=6,
                                                   n_hidden=1))
  emb0 = np.random.default_rng(0).normal(size=(data.num_clients, 3)).astype(np.float32)
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=2,
                hidden=6, n_hidden=1, embed_dim=3, **HN)
  alg = pfedhn(hn_params=hn0, embeddings=emb0, embedding_step="mean", **common)
  start = jax.jit(alg.init)(jax.random.key(7)).server_state
  chex.assert_trees_all_equal(jax.tree.map(lambda a: np.asarray(a[0]), start.hnet), hn0)
  np.testing.assert_array_equal(np.asarray(start.embeddings[0]), emb0)
  key = jax.random.key(9)
  state, _ = _run(alg, data, 2, key)
  leaves, treedef = jax.tree.flatten(template)
  ref_kw = dict(cohort_size=2, lr=LR, batch_size=B, steps=np.full(data.num_clients, 3),
                hn_lr=HN["hn_learning_rate"], momentum=HN["hn_momentum"], weight_decay=HN["hn_weight_decay"],
                clip_norm=HN["clip_norm"])
  hnet, emb = ref.pfedhn_reference(model, data, hn0, emb0, treedef, [a.shape for a in leaves], 2, key,
                                   embedding_step="mean", **ref_kw)
  got = ref.np64(jax.tree.map(lambda a: a[0], state.server_state.hnet))
  chex.assert_trees_all_close(got, hnet, atol=3e-5, rtol=2e-4)
  np.testing.assert_allclose(np.asarray(state.server_state.embeddings[0]), emb, atol=3e-5, rtol=2e-4)
  _, own = ref.pfedhn_reference(model, data, hn0, emb0, treedef, [a.shape for a in leaves], 2, key, **ref_kw)
  assert not np.allclose(np.asarray(state.server_state.embeddings[0]), own, atol=1e-4)   # the step differs
  run = ml_collections.ConfigDict({"algorithm": "pfedhn", "embedding_step": "mean"})
  kw = registry.factory_kwargs("hn", run, small_context())
  assert kw["embedding_step"] == "mean"
  bad = {**hn0, "mlp": [{"kernel": np.zeros((4, 6)), "bias": np.zeros(6)}, hn0["mlp"][1]]}
  with pytest.raises(ValueError, match=r"pfedhn: hn_params\['mlp'\]\[0\]\['kernel'\] has shape \(4, 6\); "
                                       r"the hypernetwork's is \(3, 6\)"):
    pfedhn(hn_params=bad, **common)
  with pytest.raises(ValueError, match=r"pfedhn: embeddings has shape \(6, 2\); give one row of embed_dim=3 "
                                       r"per client: \(6, 3\)"):
    pfedhn(embeddings=np.zeros((6, 2)), **common)
  with pytest.raises(ValueError, match=r"pfedhn: embedding_step='flgo'; choose one of \('own', 'mean'\)"):
    pfedhn(embedding_step="flgo", **common)


def test_pfedhn_pc_keeps_each_clients_head(problem):
  data, _, model = problem
  alg = pfedhn(model=model, data=data, local_optimizer=optax.sgd(LR),
               schedule=LocalSchedule(batch_size=B, steps=2), cohort_size=3, hidden=6, personal_head=True)
  state, metrics = _run(alg, data, 2, jax.random.key(1))
  assert len(state.server_state.hnet["heads"]) == 2   # Dense_0's kernel and bias: the head is not generated
  body = 4 * (6 * 5 + 5)
  assert int(metrics["uplink_bytes"]) == body and int(metrics["downlink_bytes"]) == body
  personal_models = alg.models(state)["personal"].params
  heads = list(state.personal)   # the clients' own Dense_1 (bias, kernel), trained by the sampled ones
  chex.assert_trees_all_close(jax.tree.leaves(personal_models["Dense_1"]), heads)
  first = jax.jit(alg.init)(jax.random.key(7)).personal[1]
  moved = np.any(np.asarray(heads[1]) != np.asarray(first), axis=(1, 2))
  assert moved.sum() >= 3   # the sampled clients trained their own heads


@pytest.mark.slow
def test_pfedhn_on_a_tree_keeps_a_hypernetwork_per_parent(problem):
  data, groups, model = problem
  alg = pfedhn(model=model, data=data, topology=Topology.from_labels(groups), local_optimizer=optax.sgd(LR),
               schedule=LocalSchedule(batch_size=B, steps=2), cohort_size=2, hidden=6)
  before = jax.jit(alg.init)(jax.random.key(7)).server_state
  state, _ = _run(alg, data, 1, jax.random.key(2))
  assert state.server_state.embeddings.shape == (2, 3, 1)   # 2 parents of 3 clients, ⌊1 + 3/4⌋ = 1
  for p in range(2):   # both parents stepped their own hypernetwork
    assert not np.allclose(np.asarray(state.server_state.hnet["mlp"][0]["kernel"][p]),
                           np.asarray(before.hnet["mlp"][0]["kernel"][p]))


def test_pfedhn_takes_each_update_after_its_clients_path(problem):
  """The update path's client stage acts on every Δθ_i as it leaves its client (clipped here, as local
  DP clips before its noise), and the hypernetwork's step takes the clipped updates: the per-client loop
  with each Δθ_i clipped to the same norm; QSGD's bytes are counted up."""
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, steps=3)
  c = 0.05
  alg = pfedhn(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=2,
               hidden=6, n_hidden=1, embed_dim=3, update_paths=UpdatePath(client=clip(c)), **HN)
  key = jax.random.key(9)
  start = jax.jit(alg.init)(jax.random.key(7)).server_state
  state, metrics = _run(alg, data, 2, key)
  assert float(metrics["dp_unclipped"]) < 1.0   # the clip bites

  template = model.init(jax.random.key(0))
  leaves, treedef = jax.tree.flatten(template)
  hnet, emb = ref.pfedhn_reference(
    model, data, jax.tree.map(lambda a: a[0], start.hnet), start.embeddings[0], treedef,
    [a.shape for a in leaves], 2, key, cohort_size=2, lr=LR, batch_size=B,
    steps=np.full(data.num_clients, 3), hn_lr=HN["hn_learning_rate"], momentum=HN["hn_momentum"],
    weight_decay=HN["hn_weight_decay"], clip_norm=HN["clip_norm"], transform=clipped(c))
  got = ref.np64(jax.tree.map(lambda a: a[0], state.server_state.hnet))
  chex.assert_trees_all_close(got, hnet, atol=3e-5, rtol=2e-4)
  np.testing.assert_allclose(np.asarray(state.server_state.embeddings[0]), emb, atol=3e-5, rtol=2e-4)
  _, plain = _run(pfedhn(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=2,
                         hidden=6, n_hidden=1, embed_dim=3, **HN), data, 1, key)
  _, quantized = _run(pfedhn(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
                             cohort_size=2, hidden=6, n_hidden=1, embed_dim=3,
                             update_paths=UpdatePath(client=uplink(qsgd(bits=4))), **HN), data, 1, key)
  whole = 4 * sum(a.size for a in leaves)   # one float32 model
  # 4 bits an entry, a norm a leaf
  assert "uplink_bytes" not in plain and 0 < float(quantized["uplink_bytes"]) < whole / 3


def test_pfedhn_refusals_name_the_value(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  for kw, match in [
    (dict(hidden=0), r"hidden=0 must be an integer >= 1"),
    (dict(embed_dim=0), r"embed_dim=0 must be an integer >= 1, or -1"),
    (dict(clip_norm=0.0), r"clip_norm=0.0 must be a finite number > 0"),
    (dict(update_paths=UpdatePath(node=central(0.5, 1.0))),
     r"node transform 'dp' .* own Jacobian, never their sum"),
    (dict(update_paths=UpdatePath(aggregator=median())),
     r"robust \(blockwise\) .* no mean for a robust rule"),
    (dict(update_paths=UpdatePath(down=downlink(qsgd(bits=6)))), r"downlink transform .* \(a parcel\)"),
    (dict(personal=personal("Dense_1", level=1), topology=Topology.from_labels(np.array([0, 0, 0, 1, 1, 1]))),
     r"shared within level-1 subtrees are not supported"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      pfedhn(**{**common, **kw})
    assert "pfedhn" in str(err.value)
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"pfedhn: the model keeps state \['batch_stats'\]"):
    pfedhn(**{**common, "model": bn})
  ctx = small_context()
  run = ml_collections.ConfigDict({"algorithm": "pfedhn", "hn_learning_rate": -1.0})
  with pytest.raises(ValueError, match=r"config.runs.hn \(algorithm='pfedhn'\): pfedhn: hn_learning_rate=-1"):
    registry.build_algorithm("hn", run, ctx)
