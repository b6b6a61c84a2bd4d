"""Issue 51, clients of different widths in one vmapped tier (HeteroFL, FedRolex): against a
per-client loop that trains each client's real sliced sub-model (a smaller MLP built with its
widths, its parameters cut out of the parent's by hand), the per-coordinate mean over holders in
numpy; the sub-models' sizes against the small networks' own counts; the refusals."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from reference_baselines import close, run_jit, small_problem, start
from reference_heterogeneous import reference

from fedtree.algorithms import depthfl, fedavg, fedrolex, fjord, heterofl
from fedtree.algorithms.heterogeneous.heterofl import drawn_level, ordered_width
from fedtree.algorithms.heterogeneous.width import check_rates, client_levels, width_plan
from fedtree.core.local import LocalSchedule
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.models import build_model
from fedtree.objectives.fedprox import fedprox_update
from fedtree.toolbox import privacy as dp
from fedtree.toolbox.robust import median
from fedtree.toolbox.systems import Systems, make_profile

RATES, SHARES, LR, STEPS, BS = (1.0, 0.5, 0.25), (0.4, 0.3, 0.3), 0.1, 3, 4


@pytest.fixture(scope="module")
def problem():
  data, _, _ = small_problem()
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(6, 4))
  return data, model


def common(problem, **kw):
  data, model = problem
  return dict(model=model, data=data, local_optimizer=optax.sgd(LR),
              schedule=LocalSchedule(batch_size=BS, steps=STEPS), rates=RATES, proportions=SHARES,
              capacity_seed=1, **kw)


@pytest.mark.parametrize("method,mode", [(heterofl, "static"), (fedrolex, "rolling"), (fjord, "ordered")])
def test_the_masked_tier_is_the_per_client_loop_of_sliced_sub_models(problem, method, mode):
  data, _ = problem
  alg = method(cohort_size=5, **common(problem))
  key = jax.random.key(3)
  state, metrics = run_jit(alg, data, 3, key)
  x = jax.tree.map(lambda p: p[0], state.params[0])
  close(x, reference(data, start(alg), 3, key, cohort_size=5, mode=mode, scaler=method is not fjord,
                     rates=RATES, shares=SHARES, seed=1, lr=LR, steps=STEPS, batch_size=BS))
  # bytes: the mean size of the sampled clients' sub-models, counted on the small networks themselves
  levels = client_levels(np.asarray(SHARES), data.num_clients, 1)
  sizes = [sum(a.size for a in jax.tree.leaves(jax.eval_shape(
    build_model("mlp", example_shape=data.example_shape, num_classes=3,
                hidden=(int(np.ceil(r * 6)), int(np.ceil(r * 4)))).init, jax.random.key(0)))) * 4
    for r in RATES]
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), 5)
  last = np.asarray(sampler(stream(jax.random.fold_in(key, 2), "cohort")).clients)
  assert float(metrics["uplink_bytes"]) == pytest.approx(np.mean([sizes[levels[c]] for c in last]))


def test_fjords_self_distillation_is_the_per_client_loop_of_teacher_and_student(problem):
  """FjORD with ``distill``: every step the client's widest sub-model on the labels and the drawn width on
  ``(1 − α) CE + α T² KL``, against the loop that cuts both out of the client's model and steps each
  sub-model's coordinates by its gradient; α = 1, T = 1 (Flower's) changes the run."""
  data, _ = problem
  key = jax.random.key(3)
  alg = fjord(cohort_size=5, distill=True, distill_weight=0.5, temperature=2.0, **common(problem))
  state, _ = run_jit(alg, data, 2, key)
  x = jax.tree.map(lambda p: p[0], state.params[0])
  close(x, reference(data, start(alg), 2, key, cohort_size=5, mode="ordered", scaler=False, rates=RATES,
                     shares=SHARES, seed=1, lr=LR, steps=STEPS, batch_size=BS, distill=(0.5, 2.0)))
  flower, _ = run_jit(fjord(cohort_size=5, distill=True, **common(problem)), data, 2, key)
  plain, _ = run_jit(fjord(cohort_size=5, **common(problem)), data, 2, key)
  gap = lambda a, b: max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(   # noqa: E731
    jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True))
  assert gap(flower, state) > 1e-4 and gap(flower, plain) > 1e-4


def test_fjords_self_distillation_refusals(problem):
  with pytest.raises(ValueError, match=r"fjord: distill_weight=1.5 must be in \[0, 1\]"):
    fjord(distill=True, distill_weight=1.5, **common(problem))
  with pytest.raises(ValueError, match="fjord: temperature=0.0 must be a finite number > 0"):
    fjord(distill=True, temperature=0.0, **common(problem))
  def prox(s):
    return fedprox_update(s.model, s.optimizer, mu=0.1, batch_size=s.batch_size, max_steps=s.max_steps)

  with pytest.raises(ValueError, match="fjord: distill=True trains on its own loss .* not a client_update's"):
    fjord(distill=True, client_update=prox, **common(problem))
  fjord(distill_weight=1.5, **common(problem))   # (ignored without distill, as the paper's FjORD)


@pytest.mark.parametrize("method,mode,dynamic", [(heterofl, "static", False), (fedrolex, "rolling", False),
                                                 (fjord, "ordered", False), (heterofl, "static", True)])
def test_central_privacy_divides_each_coordinate_by_its_expected_holders(problem, method, mode, dynamic):
  """Item 4: differential privacy's clipping at the clients and central noise at their parent, without
  noise, against the loop of sliced sub-models whose clipped updates are summed and each coordinate
  divided by its expected reporting holders (the cohort times the population's share holding it: a
  public number, where the holders that reported are not; with levels drawn every round, the levels'
  shares of the population)."""
  data, _ = problem
  path = UpdatePath(client=dp.clip(0.05), node=dp.central(0.0, 0.05, normalize="fixed", expected_weight=5.0))
  alg = method(cohort_size=5, update_paths=path, capacities="dynamic" if dynamic else "seeded",
               **{**common(problem), "weighting": "uniform"})
  key = jax.random.key(3)
  state, _ = run_jit(alg, data, 3, key)
  close(jax.tree.map(lambda p: p[0], state.params[0]),
        reference(data, start(alg), 3, key, cohort_size=5, mode=mode, scaler=method is not fjord, rates=RATES,
                  shares=SHARES, seed=1, lr=LR, steps=STEPS, batch_size=BS, clip=0.05, expected_weight=5.0,
                  dynamic=dynamic))


def test_central_noise_on_sub_models_has_the_stated_std_per_coordinate(problem):
  """With no training (a zero learning rate) a round moves coordinate j by the noise over its expected
  holders: ``(x − x') E_j`` is ``N(0, (z C)²)``; its std over every held coordinate of five rounds within 5
  standard errors (``σ / sqrt(2n)``)."""
  data, model = problem
  z, c = 2.0, 0.5
  path = UpdatePath(client=dp.clip(c), node=dp.central(z, c, normalize="fixed", expected_weight=5.0))
  kw = {**common(problem), "local_optimizer": optax.sgd(0.0), "weighting": "uniform"}
  alg = heterofl(cohort_size=5, update_paths=path, **kw)
  levels = client_levels(np.asarray(SHARES), data.num_clients, 1)
  plan = width_plan(start(alg), "heterofl")
  held = sum(np.asarray(jax.tree.leaves(plan.masks(start(alg), jnp.asarray(plan.kept(RATES[lv]))))[0])
             for lv in levels)   # the first leaf (Dense_0's bias): how many clients hold each coordinate
  moves = []
  state = alg.init(jax.random.key(0))
  step = jax.jit(alg.round)
  for r in range(5):
    new, _ = step(state, data, jax.random.key(r))
    before, after = (np.asarray(jax.tree.leaves(s.params[0])[0][0]) for s in (state, new))
    moves.append(((before - after) * 5.0 * held / data.num_clients)[held > 0])
    state = new
  sample = np.concatenate(moves)
  assert abs(np.std(sample) - z * c) < 5 * z * c / np.sqrt(2 * sample.size), (np.std(sample), sample.size)


@pytest.mark.parametrize("method", [heterofl, fjord])
def test_local_noise_stays_on_the_coordinates_a_client_holds(problem, method):
  """Local noise on sub-models: with no training, a coordinate moves by its reporting holders' noise over
  its expected holders, so one no reporting client holds stays put, and ``(x − x') E_j / sqrt(h_j)`` (``h_j``
  the reporting holders) is ``N(0, (z C)²)``: its std over ten rounds of 2 clients within 5 standard
  errors."""
  from fedtree.core.updates import chain

  data, _ = problem
  z, c = 2.0, 0.5
  path = UpdatePath(client=chain(dp.clip(c), dp.local_noise(z, c)),
                    node=dp.central(z, c, normalize="fixed", expected_weight=2.0, add_noise=False))
  kw = {**common(problem), "local_optimizer": optax.sgd(0.0), "weighting": "uniform"}
  alg = method(cohort_size=2, update_paths=path, **kw)
  levels = client_levels(np.asarray(SHARES), data.num_clients, 1)
  plan = width_plan(start(alg), method.__name__)

  def flat(tree):
    return np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(tree)])

  held = [flat(plan.masks(start(alg), jnp.asarray(plan.kept(r)))) for r in RATES]
  population = sum(held[lv] for lv in levels)
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), 2)
  state, step, sample, still = alg.init(jax.random.key(0)), jax.jit(alg.round), [], []
  for r in range(10):
    new, _ = step(state, data, jax.random.key(r))
    move = flat(jax.tree.map(lambda a, b: a[0] - b[0], state.params[0], new.params[0]))
    reporting = sum(held[levels[k]] for k in np.asarray(sampler(stream(jax.random.key(r), "cohort")).clients))
    still.append(move[reporting == 0])
    scale = 2.0 * population / data.num_clients / np.sqrt(np.maximum(reporting, 1))
    sample.append((move * scale)[reporting > 0])
    state = new
  still, sample = np.concatenate(still), np.concatenate(sample)
  assert still.size > 0 and np.all(still == 0)
  assert abs(np.std(sample) - z * c) < 5 * z * c / np.sqrt(2 * sample.size), (np.std(sample), sample.size)


def test_label_split_cuts_each_clients_output_layer_to_its_classes(problem):
  """HeteroFL's code's option: a client's other classes' logits are 0 and get no gradient, and each
  class's output weights are averaged over the clients that hold it; the data gives two clients one
  class missing."""
  data, _ = problem
  y = np.asarray(data.y_train).copy()
  for c in (0, 4):   # clients 0 and 4 have no example of class 2
    y[c] = np.where(y[c] == 2, 1, y[c])
  skewed = data.replace(y_train=jnp.asarray(y))
  alg = heterofl(cohort_size=5, label_split=True, **{**common(problem), "data": skewed})
  key = jax.random.key(3)
  state, _ = run_jit(alg, skewed, 2, key)
  close(jax.tree.map(lambda p: p[0], state.params[0]),
        reference(skewed, start(alg), 2, key, cohort_size=5, mode="static", scaler=True, rates=RATES,
                  shares=SHARES, seed=1, lr=LR, steps=STEPS, batch_size=BS, label_split=True))


def test_every_level_is_scored_at_its_width_and_one_level_is_fedavg(problem):
  data, model = problem
  alg = heterofl(**common(problem))
  state, _ = run_jit(alg, data, 1, jax.random.key(0))
  models = alg.models(state)
  assert sorted(models) == ["global", "own_width", "width_1", "width_1_2", "width_1_4"]
  half = jax.tree.map(lambda p: np.asarray(p[0]), models["width_1_2"].params)
  assert np.all(half["Dense_0"]["kernel"][:, 3:] == 0) and np.all(half["Dense_1"]["kernel"][3:, :] == 0)
  assert np.all(half["Dense_1"]["kernel"][:3, 2:] == 0) and np.all(half["Dense_2"]["kernel"][2:] == 0)
  levels = client_levels(np.asarray(SHARES), data.num_clients, 1)
  for c in range(data.num_clients):   # each client at its own level's width
    own = jax.tree.map(lambda p, c=c: np.asarray(p[c]), models["own_width"].params)
    name = ["width_1", "width_1_2", "width_1_4"][levels[c]]
    want = jax.tree.map(lambda p: np.asarray(p[0]), models[name].params)
    jax.tree.map(np.testing.assert_array_equal, own, want)
  # every client at width 1: the per-coordinate mean is FedAvg's mean
  kw = {k: v for k, v in common(problem).items() if k not in ("rates", "proportions", "capacity_seed")}
  one, _ = run_jit(heterofl(rates=(1.0,), **kw), data, 2, jax.random.key(0))
  avg, _ = run_jit(fedavg(**kw), data, 2, jax.random.key(0))
  close(one.params, avg.params, atol=1e-6)


def test_fjords_width_is_uniform_up_to_the_clients_own():
  """4,000 seeded draws among 3 allowed widths: each within 5 binomial standard deviations of a third,
  none beyond the client's own."""
  draws = np.asarray(jax.vmap(lambda k: ordered_width(k, 3))(jax.random.split(jax.random.key(0), 4000)))
  counts = np.bincount(draws, minlength=4)
  assert counts[3] == 0 and np.all(np.abs(counts[:3] - 4000 / 3) < 5 * np.sqrt(4000 * (1 / 3) * (2 / 3)))


@pytest.mark.parametrize("method,mode", [(heterofl, "static"), (fjord, "ordered"), (fedrolex, "rolling")])
def test_levels_drawn_every_round_are_the_per_client_loop_with_the_same_draws(problem, method, mode):
  """HeteroFL's dynamic mode: every sampled client trains the sub-model of a level drawn in its round (the
  reference draws it from the same key), the coordinates averaged over that round's holders; the byte
  columns are the drawn sub-models' mean, and no client has a width of its own to score."""
  data, _ = problem
  alg = method(cohort_size=5, capacities="dynamic", **common(problem))
  key = jax.random.key(3)
  state, metrics = run_jit(alg, data, 3, key)
  close(jax.tree.map(lambda p: p[0], state.params[0]),
        reference(data, start(alg), 3, key, cohort_size=5, mode=mode, scaler=method is not fjord, rates=RATES,
                  shares=SHARES, seed=1, lr=LR, steps=STEPS, batch_size=BS, dynamic=True))
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), 5)
  rk = jax.random.fold_in(key, 2)
  last = np.asarray(sampler(stream(rk, "cohort")).clients)
  drawn = [int(drawn_level(jax.random.fold_in(stream(rk, "train"), int(c)), np.asarray(SHARES)))
           for c in last]
  assert len(set(drawn)) > 1   # (the round's draws differ: the check below can tell them apart)
  plan = width_plan(start(alg), "heterofl")
  sizes = [plan.parameters(RATES[v]) * 4 for v in drawn]
  assert float(metrics["uplink_bytes"]) == pytest.approx(np.mean(sizes))
  assert "own_width" not in alg.models(state)
  assert np.asarray(state.client_state[1][0])[last].tolist() == drawn   # each client's level of its round


def test_levels_drawn_every_round_follow_the_proportions():
  """6,000 seeded draws: each level's count within 5 binomial standard deviations of its share."""
  keys = jax.random.split(jax.random.key(1), 6000)
  draws = np.asarray(jax.vmap(lambda k: drawn_level(k, np.asarray(SHARES)))(keys))
  for level, p in enumerate(SHARES):
    within = 5 * np.sqrt(6000 * p * (1 - p))
    assert abs(np.sum(draws == level) - 6000 * p) < within, (level, np.bincount(draws))


def test_levels_drawn_every_round_refusals(problem):
  from fedtree.core.updates import chain

  data, model = problem
  with pytest.raises(ValueError, match=r"capacities='dynamic' with systems: the clock runs each client"):
    heterofl(capacities="dynamic", systems=Systems(profile=make_profile(np.ones(data.num_clients),
                                                                         np.full(data.num_clients, 1e9))),
             **common(problem))
  with pytest.raises(ValueError, match=r"local noise with capacities='dynamic'"):
    heterofl(capacities="dynamic", update_paths=UpdatePath(
      client=chain(dp.clip(0.5), dp.local_noise(2.0, 0.5)),
      node=dp.central(2.0, 0.5, normalize="fixed", expected_weight=2.0, add_noise=False)),
      **{**common(problem), "weighting": "uniform"})
  with pytest.raises(ValueError, match=r"capacities='dynamic'; choose one of \('seeded', 'speed'\)"):
    depthfl(capacities="dynamic", **{k: v for k, v in common(problem).items() if k != "rates"})


def test_capacities_are_placed_by_their_shares():
  levels = client_levels(np.asarray([0.5, 0.25, 0.25]), 10, seed=0)
  assert np.bincount(levels).tolist() == [5, 3, 2] or np.bincount(levels).tolist() == [5, 2, 3]
  assert np.array_equal(levels, client_levels(np.asarray([0.5, 0.25, 0.25]), 10, seed=0))


def test_refusals(problem):
  data, _ = problem
  with pytest.raises(ValueError, match=r"rates=\[1.0, 0.0\] must be width ratios in \(0, 1\]"):
    check_rates((1.0, 0.0), None, "heterofl")
  with pytest.raises(ValueError, match=r"proportions=\[0.5, 0.2\] must be 2 non-negative shares .* to 0.7"):
    check_rates((1.0, 0.5), (0.5, 0.2), "heterofl")
  logreg = build_model("logreg", example_shape=data.example_shape, num_classes=3)
  with pytest.raises(ValueError, match="heterofl needs at least one hidden layer to slice"):
    heterofl(**{**common(problem), "model": logreg})
  lm = build_model("transformer_lm", example_shape=(8,), num_classes=11, dim=8, depth=1, heads=2)
  with pytest.raises(ValueError, match="heterofl cannot slice the model's parameter"):
    width_plan(jax.eval_shape(lm.init, jax.random.key(0)), "heterofl")
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,), norm="batch")
  with pytest.raises(ValueError, match="static batch normalization is not built"):
    fedrolex(**{**common(problem), "model": bn})
  # on sub-models, differential privacy's clipping and central noise run; what would act on coordinates a
  # client never held is refused by name (item 4)
  from fedtree.core.updates import chain
  from fedtree.toolbox.compression import qsgd, uplink

  uniform = {**common(problem), "weighting": "uniform"}
  central = dp.central(1.0, 1.0, normalize="fixed", expected_weight=5.0)
  for path, said in (
    (UpdatePath(aggregator=median()), "robust .* compare a holder's value with the zeros"),
    (UpdatePath(client=chain(dp.clip(1.0), uplink(qsgd(4))), node=central),
     r"client transform 'compression' .* over coordinates the client never held"),
  ):
    with pytest.raises(ValueError, match=f"heterofl: .*{said}"):
      heterofl(update_paths=path, **uniform)
  with pytest.raises(ValueError, match=r"fedrolex: local differential privacy \('dp_local_noise'\) .* window "
                                       r"moves every round"):
    fedrolex(update_paths=UpdatePath(client=chain(dp.clip(1.0), dp.local_noise(1.0, 1.0))), **uniform)
  with pytest.raises(ValueError, match="heterofl: differential privacy with label_split=True: .* reveals"):
    heterofl(update_paths=UpdatePath(client=dp.clip(1.0), node=central), label_split=True, **uniform)
  from fedtree.core.membership import Membership

  with pytest.raises(ValueError, match="heterofl: differential privacy with a membership: .* fixed tree"):
    heterofl(update_paths=UpdatePath(client=dp.clip(1.0), node=central),
             membership=Membership.static(np.zeros(9, np.int32)), **uniform)
  tree = Topology.from_labels([0, 0, 0, 0, 1, 1, 1, 1, 1])
  with pytest.raises(ValueError, match=r"fjord: an update path at level 0 \(above the clients' parents\)"):
    fjord(topology=tree, update_paths={0: UpdatePath(node=central), 1: UpdatePath(client=dp.clip(1.0))},
          **uniform)
  with pytest.raises(ValueError, match="server_rule= is not an option"):
    heterofl(server_rule=object(), **common(problem))
  tree = Topology.from_labels(np.arange(data.num_clients) % 2)
  assert "width_1_4" in heterofl(topology=tree, **common(problem)).models(
    run_jit(heterofl(topology=tree, **common(problem)), data, 1, jax.random.key(0))[0])


@pytest.mark.parametrize("offset", [0, 5])
def test_a_masked_cnn_computes_what_its_sliced_cnn_computes(offset):
  """The CNN's chain: convolutions sliced by output channels, the flatten's rows by the last
  convolution's channels at every spatial position, the hidden dense layer by its units; the masked
  full CNN (with the scaler) gives the logits of the small CNN built with those widths, its
  parameters cut out by hand, at a prefix and at a rolled window."""
  from fedtree.algorithms.heterogeneous.heterofl import masked_model

  kw = dict(example_shape=(8, 8), num_classes=3, dropout=(0.0, 0.0))
  full = build_model("cnn", features=(6, 8), dense=10, **kw)
  params = full.init(jax.random.key(0))
  plan = width_plan(params, "heterofl")
  rate = 0.5
  kept = plan.kept(rate)
  assert kept == (3, 4, 5, 3)
  _, factors = plan.factors(params, jnp.asarray(kept), rate, offset=offset)
  x = jax.random.normal(jax.random.key(1), (4, 8, 8))
  idx = [(offset + np.arange(k)) % n for k, n in zip(kept[:3], (6, 8, 10), strict=True)]
  p = jax.tree.map(np.asarray, params)
  spatial = p["Dense_0"]["kernel"].shape[0] // 8
  rows = (np.arange(spatial)[:, None] * 8 + idx[1][None, :]).ravel()
  sub = {"Conv_0": {"kernel": p["Conv_0"]["kernel"][..., idx[0]] / rate,
                    "bias": p["Conv_0"]["bias"][idx[0]] / rate},
         "Conv_1": {"kernel": p["Conv_1"]["kernel"][:, :, idx[0]][..., idx[1]] / rate,
                    "bias": p["Conv_1"]["bias"][idx[1]] / rate},
         "Dense_0": {"kernel": p["Dense_0"]["kernel"][rows][:, idx[2]] / rate,
                     "bias": p["Dense_0"]["bias"][idx[2]] / rate},
         "Dense_1": {"kernel": p["Dense_1"]["kernel"][idx[2]], "bias": p["Dense_1"]["bias"]}}
  small = build_model("cnn", features=(3, 4), dense=5, **kw)
  np.testing.assert_allclose(masked_model(full, factors).apply(params, x), small.apply(sub, x), rtol=1e-5,
                             atol=1e-5)
  assert plan.parameters(rate) == sum(a.size for a in jax.tree.leaves(sub))


def test_the_systems_clock_runs_each_client_at_its_sub_models_cost(problem):
  """One step per second for the full MLP, 10^4 bytes per second each way: a client's round takes its
  sub-model's bytes down and up plus its steps times the sub-model's share of the multiply-adds (the
  hidden layers' kept rows x columns over the full ones); the round waits for the slowest sampled one."""
  from fedtree.toolbox.systems import Systems, make_profile

  data, _ = problem
  c = data.num_clients
  systems = Systems(make_profile(np.ones(c), np.full(c, 1e4)))
  alg = heterofl(cohort_size=5, systems=systems, **common(problem))
  key = jax.random.key(3)
  _, metrics = run_jit(alg, data, 1, key)
  levels = client_levels(np.asarray(SHARES), c, 1)
  dims = [data.example_shape[0], 6, 4, 3]

  def cost(r):   # (multiply-adds of the kernels, parameters) of the MLP of rate r
    w = [dims[0], int(np.ceil(r * 6)), int(np.ceil(r * 4)), 3]
    pairs = list(zip(w[:-1], w[1:], strict=True))
    return sum(a * b for a, b in pairs), sum(a * b + b for a, b in pairs)

  sampler = cohort_sampler(np.zeros(c, np.int32), 5)
  drawn = np.asarray(sampler(stream(jax.random.fold_in(key, 0), "cohort")).clients)
  seconds = [STEPS * cost(RATES[levels[k]])[0] / cost(1.0)[0] + 2 * 4 * cost(RATES[levels[k]])[1] / 1e4
             for k in drawn]
  assert float(metrics["round_seconds"]) == pytest.approx(max(seconds), rel=1e-5)
  # FjORD's self-distillation: a step runs the client's widest sub-model and a width drawn up to it
  _, metrics = run_jit(fjord(cohort_size=5, systems=systems, distill=True, **common(problem)), data, 1, key)
  both = [STEPS * (cost(RATES[levels[k]])[0] + np.mean([cost(q)[0] for q in RATES if q <= RATES[levels[k]]]))
          / cost(1.0)[0] + 2 * 4 * cost(RATES[levels[k]])[1] / 1e4 for k in drawn]
  assert float(metrics["round_seconds"]) == pytest.approx(max(both), rel=1e-5)


def test_capacities_by_speed_give_the_fastest_devices_the_largest_sub_models(problem):
  """``capacities="speed"``: the levels follow the run's systems profile (FedScale's device traces, say):
  with speeds rising by client, the slowest clients get the narrowest rate; without systems it is
  refused by name."""
  from fedtree.toolbox.systems import Systems, make_profile

  data, _ = problem
  c = data.num_clients
  speed = np.arange(1, c + 1, dtype=np.float64)[::-1].copy()   # client 0 the fastest
  levels = client_levels(np.asarray(SHARES), c, 0, sizes=np.asarray(RATES), speed=speed)
  order = np.asarray(RATES)[levels][np.argsort(speed)]   # the clients' rates from the slowest up
  assert np.all(np.diff(order) >= 0) and order[0] == min(RATES) and order[-1] == max(RATES)
  assert np.bincount(levels, minlength=3).tolist() == np.bincount(client_levels(np.asarray(SHARES), c, 0),
                                                                  minlength=3).tolist()
  systems = Systems(make_profile(speed, np.full(c, 1e6)))
  assert heterofl(capacities="speed", systems=systems, **common(problem)) is not None
  with pytest.raises(ValueError, match="heterofl: capacities=.speed. places the levels by the devices"):
    heterofl(capacities="speed", **common(problem))
  with pytest.raises(ValueError, match=r"capacities='fast'; choose one of \('seeded', 'speed', 'dynamic'\)"):
    heterofl(capacities="fast", **common(problem))
