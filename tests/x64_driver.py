"""Run under ``JAX_ENABLE_X64=1`` by tests/test_float64.py (x64 is process-global, so it gets
its own process): ``python x64_driver.py NAME...`` with NAME among ``fedavg``, ``fedadam``,
``pfedme``, ``scaffold_ref``, ``fednova_ref``, ``fedasync_ref``, ``fedbuff_ref`` (largest deviation from
the per-client reference loop, four rounds for the last four: issue 57), the ``<algorithm>_ref`` of
tests/x64_references.py (every other algorithm with a per-client loop: FedDyn, Mime, q-FFL, AFL, MOON,
HierFAVG, FedProx, Ditto, Per-FedAvg, FedKWS, APFL, FedALA, FedEM, the clustered (IFCA, CFL, AWCFL,
MCFL), the partially personalized (FedPer, LG-FedAvg, FedBN, FedRep, FedBABU, FedRoD), B-HFL, the width
methods (HeteroFL, FedRolex, FjORD); the
deviation, or the error), ``compiles`` (traces of the fused x64 round over three calls) and
:data:`OTHERS` (dtypes after one round, or the error). Prints one JSON line."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

assert jax.config.jax_enable_x64, "run with JAX_ENABLE_X64=1"

import reference as ref  # noqa: E402
import reference_baselines as bref  # noqa: E402
import reference_personalization as pref  # noqa: E402
import x64_references  # noqa: E402
from helpers import count_traces  # noqa: E402
from x64_references import f64_data, f64_model  # noqa: E402

from fedtree import algorithms as A  # noqa: E402
from fedtree.core import loop  # noqa: E402
from fedtree.core.data import as_device  # noqa: E402
from fedtree.core.local import ClientData, LocalSchedule  # noqa: E402
from fedtree.core.rng import stream  # noqa: E402
from fedtree.core.sampling import cohort_sampler  # noqa: E402
from fedtree.core.server import fedopt  # noqa: E402
from fedtree.core.topology import Topology  # noqa: E402
from fedtree.datasets.synthetic import grouped_synthetic  # noqa: E402
from fedtree.models import build_model  # noqa: E402

LR, B = 0.1, 4


def maxdiff(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def row0(tree):
  return jax.tree.map(lambda p: p[0], tree)


def main():
  data, groups = grouped_synthetic(group_sizes=(3, 2, 3), dim=5, num_classes=3, mean_examples=8,
                                   min_examples=3, max_examples=11, test_examples=3, seed=3)
  data = as_device(data)
  data = f64_data(data)
  model = f64_model(build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,)))
  out = {}
  key = jax.random.key(11)

  # FedAvg (epochs, sampled cohort, chunks) and FedAdam (paper form), 2 rounds each.
  sched = LocalSchedule(batch_size=B, epochs=1)
  steps = sched.num_steps(np.asarray(data.n_train))
  server = fedopt("adam", learning_rate=0.05, b1=0.9, b2=0.99, tau=1e-3)
  want = set(sys.argv[1:])
  for name, kw in (("fedavg", {}), ("fedadam", dict(server_optimizer=server, weighting="uniform"))):
    if name not in want:
      continue
    alg = A.fedavg(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
                   cohort_size=4, chunk_size=2, **kw)
    state = alg.init(jax.random.key(7))
    theta = row0(state.params[0])
    adam = ref.PaperFedAdam(theta, lr=0.05, b1=0.9, b2=0.99, tau=1e-3) if kw else None
    sampler = cohort_sampler(np.zeros(data.num_clients, int), 4)
    for r in range(2):
      rk = jax.random.fold_in(key, r)
      state, _ = alg.round(state, data, rk)
      cohort = [int(c) for c in np.asarray(sampler(stream(rk, "cohort")).clients)]
      models = ref.client_models(model, {0: theta}, data, [(c, 0) for c in cohort], rk,
                                 lr=LR, batch_size=B, num_steps=steps)
      w = [1.0] * len(cohort) if kw else [float(data.n_train[c]) for c in cohort]
      mean = ref.weighted_average([models[c] for c in cohort], w)
      theta = adam.step(ref.to_np(theta), jax.tree.map(lambda t, m: t - m, ref.to_np(theta), mean)) \
        if kw else mean
      theta = jax.tree.map(jnp.asarray, theta)
    out[name] = {"maxdiff": maxdiff(row0(state.params[0]), theta),
                 "dtypes": sorted({str(a.dtype) for a in jax.tree.leaves(state.params)})}

  # pFedMe: one round, every client.
  if "pfedme" in want:
    pfedme_vs_reference(model, data, key, sched, steps, out)
  for name, check in REFERENCES.items():   # issue 57: rounds against per-client loops in float64
    if name in want:
      try:
        out[name] = check(model, data, groups)
      except Exception as e:  # noqa: BLE001 -- reported to the test, which names the algorithm
        out[name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}

  # The x64 round compiles once over three calls of the fused loop.
  if "compiles" in want:
    alg = A.fedavg(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4)
    counted, traces = count_traces(alg)
    step = loop.compile_rounds(counted, 2)
    state = alg.init(jax.random.key(0))
    for i in range(3):
      state, _ = step(state, data, jax.random.key(i))
    out["compiles"] = len(traces)
  if "sweep" in want:   # a swept float is traced in the run's dtype (float64 here)
    from fedtree.core.sweep import sweep

    swept = sweep(lambda hp: A.fedprox(mu=hp["mu"], model=model, data=data, local_optimizer=optax.sgd(LR),
                                       schedule=sched), {"mu": [0.01, 0.1]}, [0, 1])
    st = swept.init(None)
    st, _ = jax.jit(swept.round)(st, data, key)
    out["sweep"] = {"hparams": str(st.hparams["mu"].dtype),
                    "dtypes": sorted({str(a.dtype) for a in jax.tree.leaves(st.inner.params)})}
  others_run_one_round(model, data, groups, key, [n for n in sys.argv[1:] if n in OTHERS], out)
  print(json.dumps(out))


def pfedme_vs_reference(model, data, key, sched, steps, out):
  hp = dict(lam=2.0, inner_steps=2, personal_lr=0.05)
  beta, lr = 0.6, 0.03
  alg = A.pfedme(beta=beta, learning_rate=lr, model=model, data=data, schedule=sched,
                 local_optimizer=optax.sgd(LR), **hp)
  state = alg.init(jax.random.key(0))
  theta = row0(state.params[0])
  new, _ = jax.jit(alg.round)(state, data, key)
  tkey = stream(key, "train")
  n = np.asarray(data.n_train, np.float64)
  ws = [pref.pfedme(model, theta, ClientData(data.x_train[c], data.y_train[c], data.n_train[c]),
                    int(steps[c]), jax.random.fold_in(tkey, c), lr=lr, batch_size=B, **hp)[0]
        for c in range(data.num_clients)]
  mean = jax.tree.map(lambda *a: sum(ni * np.asarray(ai) for ni, ai in zip(n, a, strict=True)) / n.sum(), *ws)
  want = jax.tree.map(lambda t, m: (1 - beta) * np.asarray(t) + beta * m, theta, mean)
  out["pfedme"] = {"maxdiff": maxdiff(row0(new.params[0]), want),
                   "dtypes": sorted({str(a.dtype) for a in jax.tree.leaves(new.params)})}



def _dtypes(tree):
  return sorted({str(a.dtype) for a in jax.tree.leaves(tree)})


def scaffold_vs_reference(model, data, groups):
  """SCAFFOLD (option II, the variate over all N clients: 1/N, issue 57 item 1) at 3 edges of 3, 2 and
  3 clients under a root every 2 rounds, four rounds."""
  topo = Topology.from_labels(groups)
  sched = LocalSchedule(batch_size=B, epochs=1)
  alg = A.scaffold(model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR),
                   local_learning_rate=LR, schedule=sched, cohort_size=2, chunk_size=2, option="II",
                   variate_average="all", periods=(2,))
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 4, key)
  parent = topo.parent(2)
  x, c, c_i = bref.scaffold_rounds(model, data, bref.start(alg), parent, 4, key, cohort_size=2, option="II",
                                   average="all", eta_g=1.0, steps=sched.num_steps(np.asarray(data.n_train)),
                                   root_period=2, weights=[float(np.sum(parent == g)) for g in range(3)],
                                   lr=LR, batch_size=B, dtype=np.float64)
  diff = max([maxdiff(row0(state.params[0]), x[0])]
             + [maxdiff(jax.tree.map(lambda a, g=g: a[g], state.server_state), c[g]) for g in range(3)]
             + [maxdiff(jax.tree.map(lambda a, k=k: a[k], state.client_state), c_i[k])
                for k in range(data.num_clients)])
  return {"maxdiff": diff, "dtypes": _dtypes((state.params, state.server_state, state.client_state))}


def fednova_vs_reference(model, data, groups):
  """FedNova with momentum (ρ^k, ‖a‖₁ and 1/‖a‖₁: issue 57 item 2), ``"scaled"`` (N/|S|), four rounds."""
  c = data.num_clients
  sched = LocalSchedule(batch_size=B, steps=tuple(1 + i % 4 for i in range(c)))
  alg = A.fednova(model=model, data=data, local_optimizer=optax.sgd(LR, momentum=0.9), schedule=sched,
                  cohort_size=3, chunk_size=2, momentum=0.9, aggregation="scaled", weighting="examples")
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 4, key)
  x = bref.fednova_rounds(model, data, bref.start(alg), np.zeros(c, int), 4, key, cohort_size=3,
                          aggregation="scaled", weights=np.asarray(data.n_train, np.float64),
                          steps=sched.num_steps(np.asarray(data.n_train)), momentum=0.9, lr=LR, batch_size=B,
                          dtype=np.float64)
  return {"maxdiff": maxdiff(row0(state.params[0]), x[0]), "dtypes": _dtypes(state.params)}


SPEEDS = np.array([1.3, 0.7, 1.0, 1.9, 0.45, 0.83, 1.57, 0.61])   # steps per second, no ties


def _async_rounds(alg, data, key, rounds=4):
  state, step, states = alg.init(jax.random.key(7)), jax.jit(alg.round), []
  for r in range(rounds):
    state, m = step(state, data, jax.random.fold_in(key, r))
    states.append((state, int(m["max_staleness"])))
  return states


def _async_problem(data):
  from fedtree.toolbox.systems import Systems, make_profile

  c = data.num_clients
  return c, Systems(profile=make_profile(SPEEDS[:c], np.full(c, 1e12))), LocalSchedule(batch_size=B, steps=3)


def fedasync_vs_reference(model, data, groups):
  """FedAsync, every client in flight, the polynomial staleness (1 + τ)^-a (issue 57 item 3), four
  server updates."""
  c, systems, sched = _async_problem(data)
  alg = A.fedasync(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, concurrency=c,
                   systems=systems, alpha=0.6, staleness_exponent=0.5, max_staleness=10)
  key = jax.random.key(3)
  states = _async_rounds(alg, data, key)
  models, stale = bref.fedasync_event_loop(model, row0(alg.init(jax.random.key(7)).params), data, SPEEDS[:c],
                                           np.full(c, 3), 4, key, lr=LR, batch_size=B, alpha=0.6,
                                           s=lambda t: (1.0 + t) ** -0.5, dtype=np.float64)
  return {"maxdiff": max(maxdiff(row0(s.params), x) for (s, _), x in zip(states, models[1:], strict=True)),
          "staleness": [m for _, m in states], "want_staleness": stale,
          "dtypes": _dtypes(states[-1][0].params)}


def fedbuff_vs_reference(model, data, groups):
  """FedBuff, buffers of 2, every client in flight, (1 + τ)^-½ (issue 57 item 3), four server updates."""
  c, systems, sched = _async_problem(data)
  alg = A.fedbuff(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, buffer_size=2,
                  concurrency=c, systems=systems, max_staleness=10, staleness_exponent=0.5)
  key = jax.random.key(3)
  states = _async_rounds(alg, data, key)
  models, stale = bref.fedbuff_event_loop(model, row0(alg.init(jax.random.key(7)).params), data, SPEEDS[:c],
                                          np.full(c, 3), np.asarray(data.n_train), 4, key, buffer=2, lr=LR,
                                          batch_size=B, exponent=0.5)
  return {"maxdiff": max(maxdiff(row0(s.params), x) for (s, _), x in zip(states, models[1:], strict=True)),
          "staleness": [m for _, m in states], "want_staleness": [max(s) for s in stale],
          "dtypes": _dtypes(states[-1][0].params)}


REFERENCES = {"scaffold_ref": scaffold_vs_reference, "fednova_ref": fednova_vs_reference,
              "fedasync_ref": fedasync_vs_reference, "fedbuff_ref": fedbuff_vs_reference,
              **x64_references.REFERENCES}


OTHERS = ("hierfavg", "fedprox", "ditto", "perfedavg", "perfedavg_hf", "pfedmt", "fedkws", "ifca",
          "cfl", "mcfl", "awcfl", "bhfl", "scaffold", "feddyn", "fednova", "mime", "mimelite", "moon", "qffl",
          "afl", "fedasync", "apfl", "fedala", "fedem", "knnper")


def others_run_one_round(model, data, groups, key, names, out):
  """Every other algorithm: one round; its models' dtypes, finiteness and loss dtype."""
  topo = Topology.from_labels(groups)
  base = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
              schedule=LocalSchedule(batch_size=B, steps=2))
  others = {
    "hierfavg": lambda: A.hierfavg(topology=topo, periods=(2,), **base),
    "fedprox": lambda: A.fedprox(mu=0.1, **base),
    "ditto": lambda: A.ditto(lam=0.1, **base),
    "perfedavg": lambda: A.perfedavg(alpha=0.05, beta=0.1, **base),
    "perfedavg_hf": lambda: A.perfedavg(alpha=0.05, beta=0.1, variant="hf", **base),
    "pfedmt": lambda: A.pfedmt(model=model, topology=topo, data=data, schedule=base["schedule"],
                               team_iters=2, cohort_size=2),
    "fedkws": lambda: A.fedkws(**base),
    "ifca": lambda: A.ifca(num_clusters=2, **base),
    "cfl": lambda: A.cfl(max_clusters=2, eps1=1e3, eps2=1e-4, **base),
    "mcfl": lambda: A.mcfl(num_clusters=2, cluster_start_round=0, kmeans_iters=2, **base),
    "awcfl": lambda: A.awcfl(num_clusters=2, beta=0.5, cluster_start_round=0, kmeans_iters=2, **base),
    "bhfl": lambda: A.bhfl(topology=topo, periods=(2, 1), **base),
    "scaffold": lambda: A.scaffold(local_learning_rate=LR, **base),
    "feddyn": lambda: A.feddyn(alpha=0.1, **base),
    "fednova": lambda: A.fednova(**{**base, "schedule": LocalSchedule(batch_size=B, epochs=1)}),
    "mime": lambda: A.mime(**{**base, "local_optimizer": optax.sgd(LR, momentum=0.9)}),
    "mimelite": lambda: A.mimelite(**{**base, "local_optimizer": optax.sgd(LR, momentum=0.9)}),
    "moon": lambda: A.moon(mu=1.0, **base),
    "qffl": lambda: A.qffl(q=1.0, local_learning_rate=LR, **base),
    "afl": lambda: A.afl(domain_learning_rate=0.5, **base),
    "fedasync": lambda: A.fedasync(concurrency=2, **base),
    "apfl": lambda: A.apfl(local_learning_rate=LR, **base),
    "fedala": lambda: A.fedala(max_ala_epochs=4, **base),
    "fedem": lambda: A.fedem(num_components=2, **base),
    "knnper": lambda: A.knnper(k=3, **base),
  }
  assert set(others) == set(OTHERS)
  for name in names:
    try:
      alg = others[name]()
      state = alg.init(jax.random.key(0))
      state, metrics = jax.jit(alg.round)(state, data, key)
      leaves = [a for a in jax.tree.leaves(alg.models(state)) if hasattr(a, "dtype")
                and jnp.issubdtype(a.dtype, jnp.floating)]
      out[name] = {"dtypes": sorted({str(a.dtype) for a in leaves}),
                   "finite": bool(all(np.all(np.isfinite(np.asarray(a))) for a in leaves)),
                   "loss_dtype": str(jnp.asarray(metrics["train_loss"]).dtype)}
    except Exception as e:  # noqa: BLE001 -- reported to the test, which names the algorithm
      out[name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}


if __name__ == "__main__":
  main()
