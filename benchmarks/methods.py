r"""What each optimization baseline costs against FedAvg's round, measured in the same run.

  python -m benchmarks.methods                           # workload (a) at 100 clients, every method
  python -m benchmarks.methods --clients=1000 --methods=fedavg,scaffold,feddyn
  python -m benchmarks.methods --workload=b              # the CNN workload (cohort 50 of 1,000)
  python -m benchmarks.methods --clients=10000 --rounds=5 --repeats=3 \
    --methods=fedavg,scaffold,feddyn,personal_head,dp,median,qsgd8   # issue 41's rows (a GPU session)

Every method runs one workload of :mod:`benchmarks.workloads` ((a) by default: the 60-200-200-10
MLP, 64 examples per client, 4 local steps of batch 16, every client sampled) with the same model,
data, cohort, local steps, local learning rate and chunk size (FedAvg's, from the CPU chunk
policy), on one device, ``--rounds`` rounds fused per compiled call
(:func:`fedtree.core.loop.compile_rounds`). The calls are interleaved across the methods (A B C
A B C ...) for ``--repeats`` turns, so a change of the machine's load falls on all of them alike,
and each call is timed twice: by the wall clock and by this process's CPU time
(``time.process_time``: the work of every thread XLA runs, whatever else the machine does, the
figure to trust on a shared machine). Reported per method: seconds per round (the median over
the turns), client updates per second (clients trained per round over those seconds) and the
ratio of its time per client update to FedAvg's in the same turn (the median over the turns, and
their range), by CPU time and by wall time; the compile time (the first call) apart. Where a
method trains FedAvg's cohort every round, that ratio is its round's time over FedAvg's. The
client updates are what each method's clients do in a round: FedDyn's regularized steps, FedNova's
normalization, SCAFFOLD's corrected steps and new variate (option II), MimeLite's steps and its
full-batch gradient, Mime's gradient pass, doubly-evaluated corrected steps and the server's
statistics (its base optimizer is SGD with momentum 0.9, the others' plain SGD); MOON's
contrastive steps (three forward passes a step) and its previous models per client; q-FFL's loss
at the received model, ``Δ_k`` and ``h_k``; AFL's losses per domain and the ascent on ``λ``;
HeteroFL's, FedRolex's and FjORD's masked steps at five widths (:data:`WIDTHS`: every client computes on the
full shapes) and their per-coordinate mean; DepthFL's exits and their mutual distillation at three depths;
FedDF's 10 distillation steps on 32 of 256 public inputs at the server; FedMD's 10 digest steps on 64 of
them and its scores (its clients keep their own models); FedEx's draw of a scale among five, its steps
on 80 % of each client's examples and two evaluation passes over its validation rows (the received and
the trained model), and the server's exponentiated-gradient step.
FedAsync's round is one server update that applies one client's model (:data:`ONE_CLIENT_A_ROUND`,
10 clients in flight, FedBuff's ring of versions): its calls fuse ``cohort × --rounds`` rounds, as
many client updates as the others' calls, and its ratio is the cost of a client update simulated
one at a time against FedAvg's vmapped cohort.
Writes ``benchmarks/results/<tag>.json``.

Methods are named in :data:`METHODS` (one builder each), so another baseline joins with one line.
:data:`CAPABILITIES` (named with ``--methods``, never run by default) are FedAvg with one capability
each, timed the same way: ``personal_head`` (the MLP's last layer ``Dense_2`` stays with each client,
:func:`fedtree.core.personal.personal`), ``dp`` (per-client clipping to norm 1 and central Gaussian
noise z = 1, :func:`benchmarks.privacy.dp_path`), ``median`` (the coordinate-wise median of the
cohort's updates, kept as one block, :func:`fedtree.toolbox.robust.median`) and ``qsgd8`` (8-bit QSGD
on the uplink, :mod:`fedtree.toolbox.compression`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
import optax

from benchmarks import workloads
from benchmarks.jax_runners import build_fedtree, federated_data, jax_model
from benchmarks.privacy import dp_path
from fedtree import algorithms
from fedtree.core.local import LocalSchedule
from fedtree.core.loop import compile_rounds
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath, chain
from fedtree.toolbox import compression, privacy, robust

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _common(w: workloads.Workload, data, chunk) -> dict:
  return dict(model=jax_model(w), data=data, local_optimizer=optax.sgd(w.lr),
              schedule=LocalSchedule(batch_size=w.batch_size, steps=w.local_steps), cohort_size=w.cohort,
              chunk_size=chunk)


METHODS: dict[str, Callable[[dict, workloads.Workload], algorithms.FederatedAlgorithm]] = {
  "fedavg": lambda c, w: algorithms.fedavg(server_optimizer=optax.sgd(w.server_lr), **c),
  "scaffold": lambda c, w: algorithms.scaffold(local_learning_rate=w.lr, server_learning_rate=w.server_lr,
                                               **c),
  "feddyn": lambda c, w: algorithms.feddyn(alpha=0.01, **c),
  "fednova": lambda c, w: algorithms.fednova(**c),
  "fedex": lambda c, w: algorithms.fedex(lr_scales=(0.25, 0.5, 1.0, 2.0, 4.0), **c),
  "mimelite": lambda c, w: algorithms.mimelite(**{**c, "local_optimizer": optax.sgd(w.lr, momentum=0.9)}),
  "mime": lambda c, w: algorithms.mime(**{**c, "local_optimizer": optax.sgd(w.lr, momentum=0.9)}),
  "moon": lambda c, w: algorithms.moon(mu=1.0, **c),
  "qffl": lambda c, w: algorithms.qffl(q=1.0, local_learning_rate=w.lr, **c),
  "afl": lambda c, w: algorithms.afl(domain_learning_rate=0.01, **c),
  "heterofl": lambda c, w: algorithms.heterofl(rates=WIDTHS, **c),
  "fedrolex": lambda c, w: algorithms.fedrolex(rates=WIDTHS, **c),
  "fjord": lambda c, w: algorithms.fjord(rates=WIDTHS, **c),
  "depthfl": lambda c, w: algorithms.depthfl(**c),
  "feddf": lambda c, w: algorithms.feddf(public=_public(w), distill_steps=10, **c),
  "fedmd": lambda c, w: algorithms.fedmd(public=_public(w), public_subset=64, digest_steps=10, **c),
  "fedasync": lambda c, w: algorithms.fedasync(
    concurrency=min(ASYNC_IN_FLIGHT, w.cohort_size), **{k: v for k, v in c.items()
                                                        if k not in ("cohort_size", "chunk_size")}),
}
"""``name -> builder(common arguments, workload)``: the methods this benchmark times."""
def _public(w: workloads.Workload) -> np.ndarray:
  """256 unlabeled public inputs for FedDF and FedMD, drawn as the workload's own inputs are."""
  key = jax.random.key(w.seed + 1)
  return np.asarray(jax.random.normal(key, (256,) + tuple(w.example_shape)), np.float32)


WIDTHS = (1.0, 0.5, 0.25, 0.125, 0.0625)
"""HeteroFL's, FedRolex's and FjORD's levels (HeteroFL's a-e), a fifth of the clients each."""
ASYNC_IN_FLIGHT = 10
"""FedAsync's clients in flight (``concurrency``), as in ``configs/baselines.py``."""
ONE_CLIENT_A_ROUND = ("fedasync",)
"""The methods whose round applies one client's update: a call fuses ``cohort × --rounds`` rounds."""


def _fedavg_with(**host) -> Callable[[dict, workloads.Workload], algorithms.FederatedAlgorithm]:
  return lambda c, w: algorithms.fedavg(server_optimizer=optax.sgd(w.server_lr), **c, **host)


CAPABILITIES: dict[str, Callable[[dict, workloads.Workload], algorithms.FederatedAlgorithm]] = {
  "personal_head": _fedavg_with(personal=personal("Dense_2")),
  "dp": _fedavg_with(update_paths=dp_path(1.0, 1.0)),
  "median": _fedavg_with(update_paths=UpdatePath(aggregator=robust.median())),
  "qsgd8": _fedavg_with(update_paths=UpdatePath(
    client=compression.uplink(compression.qsgd(bits=8)))),
}
"""FedAvg with one capability each (module docstring), timed when named in ``--methods``."""



def _edges(c: dict) -> dict:
  """``c`` on a tree of 4 edge servers under a root (B-HFL's, which needs one), clients dealt round-robin."""
  n = c["data"].num_clients
  return {**c, "topology": Topology.from_labels(np.arange(n) % 4),
          "cohort_size": None if c["cohort_size"] is None else max(c["cohort_size"] // 4, 1)}


_MEDIAN = UpdatePath(aggregator=robust.median())
_QSGD8 = UpdatePath(client=compression.uplink(compression.qsgd(bits=8)))
_LOCAL_DP = UpdatePath(client=chain(privacy.clip(1.0), privacy.local_noise(1.0, 1.0)))

COMPOSED: dict[str, Callable[[dict, workloads.Workload], algorithms.FederatedAlgorithm]] = {
  "ifca": lambda c, w: algorithms.ifca(num_clusters=2, **c),
  "ifca_median": lambda c, w: algorithms.ifca(num_clusters=2, update_paths=_MEDIAN, **c),
  "ifca_dp": lambda c, w: algorithms.ifca(num_clusters=2, update_paths=dp_path(1.0, 1.0),
                                          **{**c, "weighting": "uniform"}),
  "cfl": lambda c, w: algorithms.cfl(max_clusters=2, **c),
  "cfl_median": lambda c, w: algorithms.cfl(max_clusters=2, update_paths=_MEDIAN, **c),
  "bhfl": lambda c, w: algorithms.bhfl(**_edges(c)),
  "bhfl_median": lambda c, w: algorithms.bhfl(update_paths=_MEDIAN, **_edges(c)),
  "scaffold_dp": lambda c, w: algorithms.scaffold(local_learning_rate=w.lr, server_learning_rate=w.server_lr,
                                                  update_paths=dp_path(1.0, 1.0), **c),
  "feddyn_median": lambda c, w: algorithms.feddyn(alpha=0.01, update_paths=_MEDIAN, **c),
  "fednova_median": lambda c, w: algorithms.fednova(update_paths=_MEDIAN, **c),
  "pfedhn": lambda c, w: algorithms.pfedhn(**c),
  "pfedhn_ldp": lambda c, w: algorithms.pfedhn(update_paths=_LOCAL_DP, **c),
  "fedamp": lambda c, w: algorithms.fedamp(**c),
  "fedamp_qsgd": lambda c, w: algorithms.fedamp(update_paths=_QSGD8, **c),
  "fedfomo": lambda c, w: algorithms.fedfomo(**c),
  "fedfomo_ldp": lambda c, w: algorithms.fedfomo(update_paths=_LOCAL_DP, **c),
  "mimelite_median": lambda c, w: algorithms.mimelite(
    **{**c, "local_optimizer": optax.sgd(w.lr, momentum=0.9)}, update_paths=_MEDIAN),
  "mimelite_dp": lambda c, w: algorithms.mimelite(
    **{**c, "local_optimizer": optax.sgd(w.lr, momentum=0.9)}, update_paths=dp_path(1.0, 1.0)),
  "qffl_median": lambda c, w: algorithms.qffl(q=1.0, local_learning_rate=w.lr, update_paths=_MEDIAN, **c),
  "qffl_dp": lambda c, w: algorithms.qffl(q=1.0, local_learning_rate=w.lr, update_paths=dp_path(1.0, 1.0),
                                          **{**c, "weighting": "uniform"}),
}
"""The compositions issue 55 opened (named with ``--methods``, never run by default): the robust
aggregator within IFCA's and CFL's clusters and at B-HFL's edges, central DP at IFCA's clusters, beside
each method's plain round; then user-level DP-SCAFFOLD (its ``(Δy_i, Δc_i)`` clipped and noised as one),
FedDyn and FedNova under the median, and the peer methods with the update path's client stage (local DP:
clip 1, z = 1, at pFedHN's ``Δθ_i`` and FedFomo's updates; 8-bit QSGD on FedAMP's, with the parents'
held copies), MimeLite with its gradients through the median and through central DP (one clip over
the pair), and q-FFL with its ``h_k`` the same way; ``x plain`` is a composed row's time per client
update over its plain method's (the name before ``_``) in the same turn."""

ROWS = {**METHODS, **CAPABILITIES, **COMPOSED}


def measure(w: workloads.Workload, names: list[str], *, rounds: int, repeats: int,
            on_turn: Callable[[list[dict], int], None] | None = None) -> list[dict]:
  """Every method of ``names`` on ``w``, interleaved (see the module docstring); ``on_turn(rows,
  turns)`` is called with the rows of the turns so far after every turn."""
  data = federated_data(w)
  _, chunk = build_fedtree(w, data)   # FedAvg's chunk for this workload, used by every method
  common = _common(w, data, chunk)
  steps, states, out = {}, {}, {}
  key = jax.random.key(w.seed)
  fused = {n: rounds * (w.cohort_size if n in ONE_CLIENT_A_ROUND else 1) for n in names}
  for name in names:
    alg = ROWS[name](common, w)
    steps[name] = compile_rounds(alg, fused[name])
    state = alg.init(key)
    t = time.perf_counter()
    state, m = steps[name](state, data, jax.random.fold_in(key, 0))
    jax.block_until_ready((state, m))
    states[name] = state
    out[name] = dict(method=name, compile_s=time.perf_counter() - t, wall=[], cpu=[],
                     clients_per_round=float(np.mean(np.asarray(m["clients_trained"]))))
  for turn in range(repeats):
    for name in names:
      wall, cpu = time.perf_counter(), time.process_time()
      states[name], m = steps[name](states[name], data, jax.random.fold_in(key, turn + 1))
      jax.block_until_ready((states[name], m))
      out[name]["wall"].append((time.perf_counter() - wall) / fused[name])
      out[name]["cpu"].append((time.process_time() - cpu) / fused[name])
      out[name]["final_loss"] = float(np.asarray(m["train_loss"])[-1])
    if on_turn is not None and turn + 1 < repeats:
      on_turn(_rows(out, names), turn + 1)
  return _rows(out, names)


def _rows(out: dict[str, dict], names: list[str]) -> list[dict]:
  """The methods' rows (medians and ratios) from the turns timed so far."""
  base = out.get("fedavg")
  rows = []
  for name in names:
    r = dict(out[name])
    r["cpu_s_per_round"] = statistics.median(r["cpu"])
    r["wall_s_per_round"] = statistics.median(r["wall"])
    r["client_updates_per_cpu_s"] = r["clients_per_round"] / r["cpu_s_per_round"]
    r["client_updates_per_wall_s"] = r["clients_per_round"] / r["wall_s_per_round"]
    if base is not None:   # each turn's time per client update over FedAvg's in the same turn (a drift
      per = base["clients_per_round"] / max(r["clients_per_round"], 1e-12)   # of the load cancels)
      for clock in ("cpu", "wall"):
        paired = [per * m / f for m, f in zip(r[clock], base[clock], strict=True)]
        r[f"{clock}_vs_fedavg"] = statistics.median(paired)
        r[f"{clock}_vs_fedavg_range"] = (min(paired), max(paired))
    rows.append(r)
  for r in rows:   # a composition over its plain method's round (COMPOSED), paired by turn
    plain = out.get(r["method"].split("_")[0]) if "_" in r["method"] else None
    if plain is not None and plain is not out[r["method"]]:
      paired = [m / f for m, f in zip(r["cpu"], plain["cpu"], strict=True)]
      r["cpu_vs_plain"] = statistics.median(paired)
  return rows


def _ratio(r: dict, clock: str) -> str:
  lo, hi = r.get(f"{clock}_vs_fedavg_range", (float("nan"),) * 2)
  return f"{r.get(f'{clock}_vs_fedavg', float('nan')):5.2f}x ({lo:.2f}-{hi:.2f})"


def table(w: workloads.Workload, rows: list[dict], load: tuple[float, float, float]) -> str:
  width = max([10] + [len(r["method"]) for r in rows])
  head = (f"{w.label()}, {w.local_steps} local steps; load average {load[0]:.1f} on {os.cpu_count()} cores\n"
          f"{'method':{width}s} {'CPU s/round':>12s} {'upd/CPU s':>10s} {'x FedAvg (range)':>19s} "
          f"{'wall s/round':>13s} {'upd/wall s':>11s} {'x FedAvg (range)':>19s} {'compile s':>10s}")
  lines = [head, "-" * len(head.splitlines()[-1])]
  for r in rows:
    lines.append(f"{r['method']:{width}s} {r['cpu_s_per_round']:12.4f} {r['client_updates_per_cpu_s']:10.0f} "
                 f"{_ratio(r, 'cpu'):>19s} {r['wall_s_per_round']:13.4f} "
                 f"{r['client_updates_per_wall_s']:11.0f} {_ratio(r, 'wall'):>19s} {r['compile_s']:10.1f}")
  lines += [f"{r['method']}: {r['cpu_vs_plain']:.2f}x {r['method'].split('_')[0]}'s round (CPU time)"
            for r in rows if "cpu_vs_plain" in r]
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workload", choices=("a", "b"), default="a")
  p.add_argument("--clients", type=int, default=100)
  p.add_argument("--methods", default=",".join(METHODS),
                 help=f"comma-separated (default: every method); also "
                      f"{', '.join({**CAPABILITIES, **COMPOSED})}")
  p.add_argument("--rounds", type=int, default=5, help="rounds fused per timed call")
  p.add_argument("--repeats", type=int, default=5, help="timed calls per method (interleaved)")
  p.add_argument("--tag", default="methods")
  p.add_argument("--out-dir", default=RESULTS)
  args = p.parse_args(argv)
  names = [n.strip() for n in args.methods.split(",") if n.strip()]
  unknown = [n for n in names if n not in ROWS]
  if unknown:
    raise SystemExit(f"--methods: unknown {unknown}; choose from {sorted(ROWS)}")
  if "fedavg" not in names:
    names = ["fedavg"] + names   # the ratios' base, measured in the same run
  w = workloads.mlp(args.clients) if args.workload == "a" else workloads.cnn(args.clients)
  os.makedirs(args.out_dir, exist_ok=True)

  def write(rows: list[dict], turns: int) -> str:   # after every turn: a killed run keeps its turns
    load = os.getloadavg()
    text = table(w, rows, load)
    with open(os.path.join(args.out_dir, f"{args.tag}.json"), "w") as f:
      json.dump(dict(workload=w.label(), rounds_per_call=args.rounds, repeats=turns, load_average=load,
                     backend=jax.default_backend(), device=jax.devices()[0].device_kind,
                     complete=turns == args.repeats, table=text, results=rows), f, indent=1)
    return text

  rows = measure(w, names, rounds=args.rounds, repeats=args.repeats, on_turn=write)
  print(write(rows, args.repeats))
  return rows


if __name__ == "__main__":
  main(sys.argv[1:])
