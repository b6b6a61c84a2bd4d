"""The fuzz over the update path's sections, sampling, systems and adapters (issue 40): random
small problems, built from a run config as the runner builds them, draw an algorithm that takes
``update_paths``, a tree (one to three groups of one to four clients, or one server), a cohort
(all, a number, one per parent), a sampling strategy (Poisson included), the sections ``attack``,
``aggregator``, ``compression`` and ``privacy`` at the clients' parents or the root, a ``systems``
section and LoRA ``adapters``. Every problem runs two rounds to a finite state whose models cover
every client, or is refused with a ``ValueError`` on one line naming the value; never a crash.

A problem may carry one of the meaningless values the issue found accepted (:data:`MEANINGLESS`:
δ above 1/n, a negative adaptive-clipping rate, a sign flip by 0, QSGD of 33 or 64 bits, 30 hours
on line a day, a LoRA rank above the kernels' sides, a level-0 section on a one-server run of a
grouped tree): it must then be refused, naming that field.

The default run checks the three combinations the issue found crashing, each once; ``-m slow``
draws :data:`PROBLEMS` seeded problems (one compile each)."""

import inspect

import jax
import ml_collections
import numpy as np
import pytest
from helpers import ALGORITHM_CASES

from fedtree.core import loop
from fedtree.experiment import registry, runner
from fedtree.experiment.capabilities import CAPABILITIES
from fedtree.experiment.fields import declare_runner_fields

ADAPTER_ALGORITHMS = registry.algorithms_taking(CAPABILITIES["adapters"])

ALGORITHMS = ("fedavg", "fedopt", "hierfavg", "fedprox", "ditto", "fedbuff")
"""Algorithms taking ``update_paths``: one server (fedavg, fedopt), a tree (hierfavg and two
objectives under it), asynchronous buffering (fedbuff)."""
SAMPLINGS = ("uniform", "poisson", "data_size", "available", "power_of_choice")
ATTACKS = (dict(name="sign_flip", scale=2.0), dict(name="scaling", factor=3.0),
           dict(name="gaussian", std=0.5), dict(name="alie"), dict(name="ipm", eps=0.5),
           dict(name="min_max"), dict(name="label_flip", target=1),
           dict(name="backdoor", target=0, trigger=dict(features=[0, 1], value=3.0)))
AGGREGATORS = (dict(name="median"), dict(name="trimmed_mean", beta=0.2), dict(name="krum", f=0),
               dict(name="multi_krum", f=0, weighted=True), dict(name="bulyan", f=0),
               dict(name="geometric_median", iterations=3), dict(name="norm_bound", tau=1.0),
               dict(name="centered_clip", tau=1.0, center="median"), dict(name="fltrust", root_fraction=0.25))
UPLINKS = (dict(name="qsgd", bits=4), dict(name="qsgd", bits=2, error_feedback=True),
           dict(name="topk", fraction=0.3), dict(name="sign", vote=0.1), dict(name="fp16"),
           dict(name="rotated", bits=3))
MEANINGLESS = {
  "delta": ("privacy", lambda r: r["privacy"].update(delta=0.5), "delta=0.5"),
  "adaptive_lr": ("privacy",
                  lambda r: r["privacy"].update(adaptive=dict(initial_clip=0.5, learning_rate=-0.2)),
                  "learning_rate=-0.2"),
  "sign_flip_0": ("attack", lambda r: r.update(attack=dict(name="sign_flip", scale=0.0, fraction=0.25)),
                  "scale=0.0"),
  "qsgd_64": ("compression", lambda r: r.update(compression=dict(uplink=dict(name="qsgd", bits=64))),
              "bits=64"),
  "qsgd_33": ("compression", lambda r: r.update(compression=dict(uplink=dict(name="qsgd", bits=33))),
              "bits=33"),
  "online_30": ("systems",
                lambda r: r.update(systems=dict(availability=dict(kind="diurnal", online_hours=30.0))),
                "online_hours=30"),
  "lora_rank": ("adapters", lambda r: r.update(adapters=dict(kind="lora", rank=64)), "rank=64"),
}
"""``{kind: (what the run needs, how to set it, what the refusal names)}``."""
PROBLEMS = 120


def _params(name):
  return registry.schema(registry.SPECS[name]).params


def _on_the_configs_tree(name: str) -> bool:
  """Whether run ``name`` is built on the config's groups (``registry.run_topology``): a factory that
  requires ``topology``, or a spec with its own tree (GroupPerFL's data groups); one whose
  ``topology`` is optional (every method on the shared host, FedProx since issue 34) runs flat."""
  spec = registry.SPECS[name]
  topo = inspect.signature(spec.factory).parameters.get("topology")
  return spec.tree is not None or (topo is not None and topo.default is inspect.Parameter.empty)


def draw(seed: int) -> tuple[ml_collections.ConfigDict, str | None]:
  """A config with one run ``r`` (seeded problem ``seed``) and the meaningless value it carries
  (a key of :data:`MEANINGLESS`) or ``None``."""
  rng = np.random.default_rng(seed)
  pick = lambda xs: xs[int(rng.integers(len(xs)))]   # noqa: E731
  name = pick(ALGORITHMS)
  params = _params(name)
  groups = tuple(int(g) for g in rng.integers(1, 5, size=int(rng.integers(1, 4))))
  run: dict = {"algorithm": name, "chunk_size": int(rng.integers(1, 4)), **ALGORITHM_CASES[name]}
  if name == "hierfavg":
    run["periods"] = (int(rng.integers(1, 3)),)
  parents = len(groups) if _on_the_configs_tree(name) else 1
  if "cohort_size" in params and name != "fedbuff":
    run["cohort_size"] = pick([None, int(rng.integers(1, 4)),
                               [int(rng.integers(1, 3)) for _ in range(parents)]])
  if "sampling" in params and rng.random() < 0.6:
    run["sampling"] = pick(SAMPLINGS)
    if run["sampling"] == "poisson":
      run["poisson_q"] = float(rng.choice([0.3, 0.6, 0.9]))
      if rng.random() < 0.5:
        run["cohort_size"] = None   # slots sized from q
  if rng.random() < 0.45:
    run["attack"] = {"fraction": 0.25, "level": pick([-1, -1, -1, 0]), **pick(ATTACKS)}
  if rng.random() < 0.45:
    run["aggregator"] = dict(pick(AGGREGATORS))
  if rng.random() < 0.4:
    comp = {"uplink": dict(pick(UPLINKS))}
    if rng.random() < 0.3:
      comp["downlink"] = dict(name="qsgd", bits=6)
    run["compression"] = comp
  if rng.random() < 0.35:
    run["weighting"] = "uniform"
    run["privacy"] = pick([dict(clip_norm=1.0, noise_multiplier=0.5),
                           dict(clip_norm=0.5, noise_multiplier=1.0, mechanism="local"),
                           dict(noise_multiplier=0.3, adaptive=dict(initial_clip=0.5, target_quantile=0.5,
                                                                    learning_rate=0.2, count_noise=0.5))])
    if name == "hierfavg" and rng.random() < 0.3:
      run["privacy"]["noise_level"] = 0
  if "systems" in params and rng.random() < 0.35:
    run["systems"] = pick([dict(speed=dict(dist="lognormal", median=2.0, sigma=0.5),
                                policy=dict(kind="deadline", seconds=2.0, partial=True)),
                           dict(availability=dict(kind="diurnal", online_hours=12.0)),
                           dict(policy=dict(kind="over_selection", factor=1.5))])
  if name in ADAPTER_ALGORITHMS and rng.random() < 0.3:
    run["adapters"] = dict(kind="lora", rank=int(rng.integers(1, 3)), alpha=2.0)
  flat = "topology" not in params and rng.random() < 0.3
  bad = None
  if rng.random() < 0.3:
    kinds = [k for k, (needs, _, _) in MEANINGLESS.items()
             if needs in ("privacy", "attack", "compression")
             or (needs == "systems" and "systems" in params)
             or (needs == "adapters" and name in ADAPTER_ALGORITHMS)]
    bad = pick(kinds)
    # the section with the bad value alone (whatever else is drawn could be refused first)
    run = {k: v for k, v in run.items()
           if k not in ("attack", "aggregator", "compression", "privacy", "systems", "adapters")}
    if MEANINGLESS[bad][0] == "privacy":
      if run.get("sampling", "uniform") not in ("uniform", "poisson"):   # (not accountable: refused first)
        run.pop("sampling")
      run["weighting"] = "uniform"
      run["privacy"] = dict(clip_norm=1.0, noise_multiplier=0.5)
      if name == "fedbuff":   # (it takes no node transform: the central noise)
        run["privacy"]["mechanism"] = "local"
    MEANINGLESS[bad][1](run)
  c = ml_collections.ConfigDict(dict(
    seed=seed, rounds=2, eval_every=2, rounds_per_call=2, progress=False, plots=False,
    data=dict(name="grouped_synthetic", group_sizes=groups, dim=5, num_classes=3, mean_examples=5,
              min_examples=int(rng.integers(1, 3)), max_examples=8, test_examples=2, seed=seed),
    topology=dict(kind="flat" if flat else "groups"), model=dict(name="mlp", hidden=(4,)),
    local=dict(optimizer="sgd", learning_rate=0.05, batch_size=3, steps=2),
    runs={"r": run}))
  return declare_runner_fields(c), bad


def check(seed: int) -> str:
  """Builds and runs problem ``seed``; returns ``"ran"`` or ``"refused"`` (asserting the
  properties of the module docstring)."""
  c, bad = draw(seed)
  c = runner.prepare_config(c)
  try:
    runner.validate_config(c)
    ctx = runner.make_context(c)
    alg = registry.build_algorithm("r", c.runs.r, ctx)
  except ValueError as e:
    msg = str(e)
    assert "=" in msg and "\n" not in msg, f"problem {seed}: a refusal must name the value on one line: {e}"
    if bad is not None:
      assert MEANINGLESS[bad][2] in msg, f"problem {seed} ({bad}) refused for another reason: {e}"
    return "refused"
  assert bad is None, f"problem {seed}: {bad} ({MEANINGLESS[bad][2]}) was accepted: {c.runs.r}"
  rounds = alg.rounds if alg.rounds is not None else 2
  try:
    state = loop.run(alg, ctx.run_data, num_rounds=rounds, key=jax.random.key(seed), rounds_per_call=rounds)
  except ValueError as e:   # a refusal when the round is traced (a robust aggregator's bound)
    assert "=" in str(e) and "\n" not in str(e), f"problem {seed}: a refusal must name the value: {e}"
    return "refused"
  assert int(state.round) == rounds
  n = ctx.data.num_clients
  for model, nm in alg.models(state).items():
    for leaf in jax.tree.leaves(nm.params):
      assert np.isfinite(np.asarray(leaf)).all(), (seed, model, c.runs.r)
    rows = jax.tree.leaves(nm.params)[0].shape[0]
    owner = np.asarray(nm.model_of_client)
    assert owner.shape == (n,) and owner.min() >= 0 and owner.max() < rows, (seed, model)
  return "ran"


CRASHES = {
  # a privacy section on a run whose cohort_size is one per parent (int() of a list)
  "privacy_cohort_per_parent": dict(algorithm="hierfavg", weighting="uniform", cohort_size=[2, 1],
                                    periods=(1,), privacy=dict(clip_norm=1.0, noise_multiplier=1.0)),
  # attack + systems + LoRA on hierfavg: the systems profile drawn inside the trace of the round
  "attack_systems_lora": dict(algorithm="hierfavg", cohort_size=2, periods=(2,),
                              attack=dict(name="sign_flip", fraction=0.25),
                              systems=dict(speed=dict(dist="lognormal", median=2.0, sigma=1.0)),
                              adapters=dict(kind="lora", rank=2)),
  # robust aggregator + attack + compression + Poisson sampling on fedopt
  "fedopt_poisson_sections": dict(algorithm="fedopt", sampling="poisson", poisson_q=0.5,
                                  server=dict(name="fedadam", learning_rate=0.01),
                                  aggregator=dict(name="median"),
                                  attack=dict(name="sign_flip", fraction=0.25),
                                  compression=dict(uplink=dict(name="qsgd", bits=4))),
}


def _crash_case(case):
  c = ml_collections.ConfigDict(dict(
    seed=0, rounds=2, eval_every=2, rounds_per_call=2, progress=False, plots=False,
    data=dict(name="grouped_synthetic", group_sizes=(4, 4), dim=5, num_classes=3, mean_examples=6,
              min_examples=2, max_examples=8, test_examples=2),
    topology=dict(kind="groups"), model=dict(name="mlp", hidden=(4,)),
    local=dict(optimizer="sgd", learning_rate=0.05, batch_size=3, steps=2),
    runs={"r": dict(chunk_size=2, **CRASHES[case])}))
  c = runner.prepare_config(declare_runner_fields(c))
  ctx = runner.make_context(c)
  return registry.build_algorithm("r", c.runs.r, ctx), ctx


@pytest.mark.parametrize("case", sorted(CRASHES))
def test_the_combinations_found_crashing_build_and_trace(case):
  """The issue's three crashes, each on 8 clients in two groups: built, and a round traced
  (``jax.eval_shape``: the crashes were in the build and in the trace; nothing compiles)."""
  alg, ctx = _crash_case(case)
  state = alg.init(jax.random.key(0))
  out, _ = jax.eval_shape(alg.round, state, ctx.run_data, jax.random.key(1))
  assert jax.tree.structure(out) == jax.tree.structure(state)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CRASHES))
def test_the_combinations_found_crashing_run(case):
  """The same, two rounds run: a finite state."""
  alg, ctx = _crash_case(case)
  state = loop.run(alg, ctx.run_data, num_rounds=2, key=jax.random.key(0), rounds_per_call=2)
  assert int(state.round) == 2
  for nm in alg.models(state).values():
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(nm.params))


def test_the_draws_cover_every_kind():
  """The draws reach every algorithm, sampling, section, systems, adapters and meaningless value
  (host code only: nothing is built)."""
  seen: set = set()
  for seed in range(PROBLEMS):
    c, bad = draw(seed)
    r = c.runs.r
    seen |= {r.algorithm, r.get("sampling", "uniform"), bad}
    seen |= {k for k in ("attack", "aggregator", "compression", "privacy", "systems", "adapters") if k in r}
  missing = (set(ALGORITHMS) | set(SAMPLINGS) | set(MEANINGLESS)
             | {"attack", "aggregator", "compression", "privacy", "systems", "adapters"}) - seen
  assert not missing


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(6))
def test_fuzz_sections(chunk):
  """:data:`PROBLEMS` seeded problems in six slices: each runs or is refused by name."""
  outcomes = [check(seed) for seed in range(chunk, PROBLEMS, 6)]
  assert "ran" in outcomes


def _tiny(run_label, **fields):
  """The quickstart's run ``run_label`` alone on 5 clients in groups of 3 and 2, with ``fields``."""
  from config_files import load_config

  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = 1, 1, 1, False, False
  c.data.group_sizes, c.data.dim, c.data.max_examples, c.data.test_examples = (3, 2), 6, 16, 4
  c.model.hidden = (4,)
  c.runs = ml_collections.ConfigDict({run_label: {**c.runs[run_label].to_dict(), "cohort_size": 2, **fields}})
  c.run_order = (run_label,)
  return c


REFUSED = {
  "delta above 1/n": ("hierfavg", dict(weighting="uniform", privacy=dict(clip_norm=1.0, noise_multiplier=1.0,
                                                                          delta=0.5)),
                      r"privacy: delta=0.5 is not below 1/n = 1/5 \(5 clients"),
  "negative adaptive rate": ("hierfavg", dict(weighting="uniform", privacy=dict(
    noise_multiplier=1.0, adaptive=dict(initial_clip=0.5, learning_rate=-0.2))),
    r"privacy: adaptive learning_rate=-0.2 must be >= 0"),
  "sign flip by 0": ("hierfavg", dict(attack=dict(name="sign_flip", fraction=0.4, scale=0.0)),
                     r"attack: sign_flip: scale=0.0 must be a finite number > 0"),
  "qsgd 64 bits": ("hierfavg", dict(compression=dict(uplink=dict(name="qsgd", bits=64))),
                   r"compression: bits=64: 'qsgd' would send 64 bits per coordinate, no fewer than a "
                   r"float32"),
  "qsgd 33 bits": ("hierfavg", dict(compression=dict(uplink=dict(name="qsgd", bits=33))), r"bits=33: "),
  "30 hours a day": ("hierfavg", dict(systems=dict(availability=dict(kind="diurnal", online_hours=30.0))),
                     r"online_hours=30.0 is longer than the day \(24 hours\)"),
  "lora rank above the kernels": ("hierfavg", dict(adapters=dict(kind="lora", rank=64)),
                                  r"adapters: LoRA rank=64 exceeds the smaller side of every adapted kernel"),
  # (a level of a one-server run in a grouped config is a level of the run's own tree, issue 43:
  # level 0 is its server, the clients' parent; level 1 does not exist there)
  "attack level 1 on a one-server run": (
    "fedavg", dict(attack=dict(name="sign_flip", fraction=0.4, level=1)),
    r"level=1: the server level whose children attack; choose one of \[0\]"),
  "poisson slots that overflow": ("hierfavg", dict(sampling="poisson", poisson_q=0.9, cohort_size=1),
                                  r"cohort_size=1 with sampling='poisson', poisson_q=0.9: parent 0's 3 "
                                  r"clients overflow its 1 slots with probability 0.972 per round .* set "
                                  r"cohort_size >= 3"),
  "poisson slots above a group": ("hierfavg", dict(sampling="poisson", poisson_q=0.1, cohort_size=3),
                                  r"cohort_size=3 \(Poisson slots per parent\) exceeds group 1, which has 2 "
                                  r"clients"),
  "majority vote by a string": ("hierfavg", dict(compression=dict(uplink=dict(name="sign", vote="0.1"))),
                                r"vote='0.1': the majority vote's step must be a number > 0"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_meaningless_values_are_refused_by_name(case):
  """Issue 40 item 7 (and item 4's Poisson slots): each value the probes found accepted is one
  line naming it, before anything compiles."""
  label, fields, message = REFUSED[case]
  c = _tiny(label, **fields)
  with pytest.raises(ValueError, match=message) as e:
    runner.train_and_evaluate(c, None)
  assert "\n" not in str(e.value)


def test_a_lora_rank_above_some_kernels_sides_is_named():
  """A rank above the smaller side of every adapted kernel is refused (no adapter is low-rank); above
  some of them, those are named (the experiment layer warns with them)."""
  from fedtree.models import build_model
  from fedtree.toolbox import lora

  model = build_model("mlp", example_shape=(6,), num_classes=3, hidden=(8,))   # kernels 6 x 8, 8 x 3
  base = model.init(jax.random.key(0))
  targets = lora.lora_targets(lora.lora(rank=4), base)
  assert lora.full_rank_kernels(lora.lora(rank=4), targets) == ["Dense_1/kernel"]
  assert lora.full_rank_kernels(lora.lora(rank=3), targets) == []
  with pytest.raises(ValueError, match=r"LoRA rank=7 exceeds the smaller side of every adapted kernel \(the "
                                       r"largest: Dense_0/kernel, 6 x 8\).*choose rank <= 6"):
    lora.lora_targets(lora.lora(rank=7), base)
