r"""Scaling report: fedtree's time per round against cohort size, tree depth and population.

  python -m benchmarks.scaling             # cohorts 10 .. 100,000 of 100,000 clients; depth 1..4
  python -m benchmarks.scaling --quick     # cohorts 10 .. 1,000 of 1,000 clients
  python -m benchmarks.scaling --sweeps=population   # a cohort of 100 of 1,000 .. 300,000 clients
  python -m benchmarks.scaling --sweeps=memory --memory-populations=10000,100000   # estimate vs peak RSS

Workload (a) (MLP 60-200-200-10, 64 examples per client, batch 16, 4 local steps). The cohort
sweep samples ``K`` of the same population every round (FedAvg, default chunk); the depth
sweep runs HierFAVG over 1,000 clients on trees of depth 1 (flat) to 4 (root -> 10 -> 20 ->
40 leaf parents -> clients), every level aggregating every round (the costliest schedule).
The population sweep (issue 43) keeps the cohort (``--population-cohort``, 100) and grows the
population (``--populations``; 16 examples per client so that 300,000 clients' data, 1.3 GB,
fits beside everything else): the round's time, its ratio to the smallest population's round,
and the cohort draw alone, fedtree's sampler (``method="auto"``: a large population draws its
cohort without touching the others) against the shuffle that sorts a key of every client (the
sampler before issue 43, ``method="shuffle"``), all measured in the same run, every population
timed in turn and its best call kept (a busy machine slows them alike).
The memory sweep (issue 58) runs the quickstart's FedAvg (2-8 examples per client, a cohort of 100,
2 rounds and an evaluation of every client) in a child process per population and sets the process's
peak its memory line states beside the peak resident set the child measured (``ru_maxrss``).
Writes ``benchmarks/results/scaling.json`` and ``scaling.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import tempfile
import time

import jax

from benchmarks import workloads
from benchmarks.jax_runners import build_fedtree, federated_data, time_fused
from benchmarks.throughput import RESULTS, machine
from fedtree.core.loop import compile_rounds


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_round(w, data, *, depth: int = 1, chunk_size="auto", repeats: int | None = None) -> dict:
  rounds = max(1, min(10, 2000 // w.cohort_size))
  alg, chunk = build_fedtree(w, data, depth=depth, chunk_size=chunk_size)
  step = compile_rounds(alg, rounds)
  state = alg.init(jax.random.key(0))
  _, first, best, loss = time_fused(step, state, data, jax.random.key(1),
                                    repeats=repeats or (2 if w.cohort_size <= 10_000 else 1))
  return dict(cohort=w.cohort_size, depth=depth, chunk_size=chunk, seconds_per_round=best / rounds,
              compile_s=first - best, client_updates_per_s=w.cohort_size * rounds / best,
              final_loss=loss, peak_rss_mb_so_far=_rss_mb())


def _best_interleaved(calls: dict, repeats: int) -> dict:
  """``{name: best seconds}`` of ``calls[name]()`` (each returns what to block on), called in
  turn ``repeats`` times: on a busy machine a burst of load then slows every population alike
  instead of one of them."""
  best = {name: float("inf") for name in calls}
  for _ in range(repeats):
    for name, call in calls.items():
      t = time.perf_counter()
      jax.block_until_ready(call())
      best[name] = min(best[name], time.perf_counter() - t)
  return best


def time_draw(population: int, cohort: int, method: str, repeats: int = 20) -> float:
  """Best seconds of one jitted cohort draw (one parent) with sampler ``method``."""
  return _best_interleaved({0: _draw_call(population, cohort, method)}, repeats)[0]


def _draw_call(population: int, cohort: int, method: str):
  import numpy as np

  from fedtree.core.sampling import cohort_sampler

  draw = jax.jit(cohort_sampler(np.zeros(population, np.int32), cohort, method=method))
  keys = iter(jax.random.split(jax.random.key(0), 10_000))
  jax.block_until_ready(draw(next(keys)))
  return lambda: draw(next(keys))


def population_sweep(populations: list[int], cohort: int, examples: int = 16,
                     repeats: int = 10) -> list[dict]:
  """Round time against the population at a fixed cohort, with the ratios the report prints
  (module docstring). Every population is built and compiled first, then timed in turn
  (:func:`_best_interleaved`), its best call of ``rounds`` fused rounds and its best draw."""
  rounds, built, rows = 10, {}, []
  for n in populations:
    w = dataclasses.replace(workloads.mlp(n), examples=examples, cohort=min(cohort, n))
    data = federated_data(w)
    alg, chunk = build_fedtree(w, data)
    step = compile_rounds(alg, rounds)
    state = {"s": alg.init(jax.random.key(0))}
    t = time.perf_counter()
    state["s"], m = step(state["s"], data, jax.random.key(1))
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t

    def call(step=step, state=state, data=data):
      state["s"], m = step(state["s"], data, jax.random.key(2))
      return m

    built[n] = call
    rows.append(dict(population=n, cohort=w.cohort_size, chunk_size=chunk, compile_s=compile_s,
                     peak_rss_mb_so_far=_rss_mb()))
  best = _best_interleaved(built, repeats)
  draws = {(n, m): _draw_call(n, min(cohort, n), m) for n in populations for m in ("auto", "shuffle")}
  best_draw = _best_interleaved(draws, 3 * repeats)
  for r in rows:
    n = r["population"]
    r.update(seconds_per_round=best[n] / rounds, draw_s=best_draw[(n, "auto")],
             shuffle_draw_s=best_draw[(n, "shuffle")])
  base = rows[0]["seconds_per_round"] if rows else 1.0
  for r in rows:
    r["round_vs_smallest"] = r["seconds_per_round"] / base
    r["shuffle_vs_draw"] = r["shuffle_draw_s"] / r["draw_s"]
  return rows


def population_table(rows: list[dict]) -> str:
  """The population sweep as the report prints it."""
  head = (f"{'population':>10}  {'ms/round':>9}  {'x smallest':>10}  {'draw ms':>8}  {'shuffle ms':>10}  "
          f"{'shuffle/draw':>12}")
  lines = [head, "-" * len(head)]
  for r in rows:
    ms, draw, shuffle = r["seconds_per_round"] * 1e3, r["draw_s"] * 1e3, r["shuffle_draw_s"] * 1e3
    lines.append(f"{r['population']:>10,}  {ms:>9.2f}  {r['round_vs_smallest']:>9.2f}x  {draw:>8.3f}  "
                 f"{shuffle:>10.3f}  {r['shuffle_vs_draw']:>11.1f}x")
  return "\n".join(lines)


MEMORY_CHILD = r"""
import contextlib, importlib.util, io, json, re, resource, sys, time
import ml_collections
from fedtree import experiment
root, clients, layout, eval_chunk = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
store = sys.argv[5] if len(sys.argv) > 5 else "None"
config = sys.argv[6] if len(sys.argv) > 6 else "None"   # "<path under configs/>[:variant]": its first run
name, _, variant = ("quickstart" if config == "None" else config).partition(":")
spec = importlib.util.spec_from_file_location("config", root + f"/configs/{name}.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
c = mod.get_config(variant) if variant else mod.get_config()
c.rounds, c.eval_every, c.rounds_per_call, c.checkpoint_every, c.progress = 2, 2, 2, 0, False
first = c.get("only", None) or list(c.run_order)[0]
c.runs = ml_collections.ConfigDict({first: c.runs[first]})
c.run_order = (first,)
c.plots = False
if config == "None":   # the quickstart's task at this population
  c.data.group_sizes, c.data.layout = (clients,), layout
  c.data.min_examples, c.data.max_examples, c.data.mean_examples, c.data.test_examples = 2, 8, 5.0, 4
  c.runs.fedavg.cohort_size = 100
if eval_chunk != "None":
  c.eval_chunk_size = eval_chunk
if store != "None":   # the same population, streamed from the store written beforehand (STORE_CHILD)
  c.data = ml_collections.ConfigDict(dict(name="store", path=store, dataset=c.data.name))
  c.population = ml_collections.ConfigDict(dict(mode="streamed", eval_clients=1000, eval_chunk=1000))
own = [0]   # the peak resident set less the store's pages mapped (a streamed run's reads: the page
def sample():   # cache's, shared and reclaimed when memory is short), sampled from /proc/self/smaps
  import threading
  def loop():
    while True:
      total = mapped = 0
      in_store = False
      with open("/proc/self/smaps") as f:
        for x in f:
          if x[0] in "0123456789abcdef" and "-" in x.split(" ", 1)[0]:
            in_store = store != "None" and store in x
          elif x.startswith("Rss:"):
            kb = int(x.split()[1]) * 1024
            total += kb
            mapped += kb if in_store else 0
      own[0] = max(own[0], total - mapped)
      time.sleep(0.1)
  threading.Thread(target=loop, daemon=True).start()
sample()
err, start = io.StringIO(), time.perf_counter()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
  experiment.train_and_evaluate(c, None)
line = next(x for x in err.getvalue().splitlines() if "memory estimate" in x)
n, unit = re.search(r"this process at peak ([\d.]+) (GiB|MiB)", line).groups()
estimate, seconds = float(n) * (2**30 if unit == "GiB" else 2**20), time.perf_counter() - start
kind = (layout if config == "None" else config) if store == "None" else "streamed"
print(json.dumps(dict(clients=clients, layout=kind, eval_chunk=eval_chunk, line=line, estimate=estimate,
                      seconds=seconds, peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      peak_own=own[0])))
"""

STORE_CHILD = r"""
import importlib.util, sys
from fedtree.experiment.data import load
from fedtree.population import write_federated_data
root, clients, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = importlib.util.spec_from_file_location("quickstart", root + "/configs/quickstart.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
c = mod.get_config()
c.data.group_sizes = (clients,)
c.data.min_examples, c.data.max_examples, c.data.mean_examples, c.data.test_examples = 2, 8, 5.0, 4
data, groups, _ = load(c.data)
write_federated_data(path, data, source={"name": c.data.name}, extras={"groups": groups})
"""


def memory_peak(clients: int, layout: str = "padded", eval_chunk=None, timeout: float = 1800,
                store: str | None = None, config: str | None = None) -> dict:
  """One child's run (:data:`MEMORY_CHILD`): the process peak its memory line states (``estimate``,
  bytes), the peak resident set it measured (``peak``), its line and seconds. ``store``: the same
  population streamed from a store at this path (written first, in a process of its own, when absent).
  ``config``: another config's first run (``"benchmarks/afo_stackoverflow:offline,quick"``, a path under
  ``configs/`` and its variant) for 2 rounds, in place of the quickstart's task at ``clients``."""
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
  if store is not None and not os.path.isdir(store):
    subprocess.run([sys.executable, "-c", STORE_CHILD, root, str(clients), store], check=True, env=env,
                   cwd=root, timeout=timeout, capture_output=True)
  out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, root, str(clients), layout, str(eval_chunk),
                        str(store), str(config)], capture_output=True, text=True, env=env, cwd=root,
                       timeout=timeout)
  if out.returncode:
    raise RuntimeError(f"the child at {clients} clients failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def memory_table(rows: list[dict]) -> str:
  """The memory sweep as the report prints it."""
  head = (f"{'clients':>10}  {'layout':>8}  {'eval chunk':>10}  {'estimate MiB':>12}  {'peak MiB':>9}  "
          f"{'ratio':>6}  {'own MiB':>9}  {'ratio':>6}")
  lines = [head, "-" * len(head)]
  for r in rows:
    est, peak, own = r["estimate"] / 2**20, r["peak"] / 2**20, r.get("peak_own", 0) / 2**20
    anon_s = f"{own:>9.0f}  {est / own:>6.3f}" if own else f"{'-':>9}  {'-':>6}"
    lines.append(f"{r['clients']:>10,}  {r['layout']:>8}  {r['eval_chunk']:>10}  {est:>12.0f}  {peak:>9.0f}  "
                 f"{est / peak:>6.3f}  {anon_s}")
  return "\n".join(lines)


SWEEPS = ("cohort", "depth", "population", "memory")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--population", type=int, default=None)
  p.add_argument("--cohorts", default=None, help="comma-separated cohort sizes")
  p.add_argument("--depths", default="1,2,3,4")
  p.add_argument("--sweeps", default=",".join(SWEEPS), help=f"comma-separated, of {SWEEPS}")
  p.add_argument("--populations", default=None, help="comma-separated (default 1,000 .. 300,000)")
  p.add_argument("--population-cohort", type=int, default=100)
  p.add_argument("--memory-populations", default="10000,100000", help="comma-separated (memory sweep)")
  p.add_argument("--memory-stores", default=None, help="the memory sweep's stores' folder")
  p.add_argument("--tag", default=None)
  p.add_argument("--out-dir", default=RESULTS)
  args = p.parse_args(argv)
  sweeps = [s for s in args.sweeps.split(",") if s]
  bad = sorted(set(sweeps) - set(SWEEPS))
  if bad:
    raise SystemExit(f"--sweeps: unknown {bad}; choose from {SWEEPS}")
  pop = args.population or (1000 if args.quick else 100_000)
  cohorts = ([int(c) for c in args.cohorts.split(",")] if args.cohorts else
             [c for c in (10, 100, 1000, 10_000, 100_000) if c <= pop])
  out = dict(machine=machine(), population=pop, cohort_sweep=[], depth_sweep=[], population_sweep=[])
  if "cohort" in sweeps:
    base = workloads.mlp(pop)
    data = federated_data(base)
    for k in cohorts:
      w = dataclasses.replace(base, cohort=k)
      r = time_round(w, data)
      out["cohort_sweep"].append(r)
      print(f"cohort {k:>7}: {r['seconds_per_round'] * 1e3:10.1f} ms/round  "
            f"{r['client_updates_per_s']:8.0f} client-updates/s  chunk {r['chunk_size']}", flush=True)
    del data
  if "depth" in sweeps:
    tree_clients = 1000
    data = federated_data(workloads.mlp(tree_clients))
    for d in [int(x) for x in args.depths.split(",") if x]:
      r = time_round(workloads.mlp(tree_clients), data, depth=d)
      out["depth_sweep"].append(r)
      print(f"depth {d}: {r['seconds_per_round'] * 1e3:10.1f} ms/round", flush=True)
    del data
  if "population" in sweeps:
    pops = ([int(x) for x in args.populations.split(",") if x] if args.populations else
            [1000, 10_000, 100_000] if args.quick else [1000, 10_000, 100_000, 300_000])
    out["population_sweep"] = population_sweep(pops, args.population_cohort)
    out["population_cohort"] = args.population_cohort
    print(f"a cohort of {args.population_cohort} against the population (FedAvg, workload (a), 16 examples "
          f"per client; draws: one jitted cohort draw, the shuffle is the sampler before issue 43):")
    print(population_table(out["population_sweep"]), flush=True)
  if "memory" in sweeps:
    pops = [int(n) for n in args.memory_populations.split(",") if n]
    stores = args.memory_stores or tempfile.mkdtemp(prefix="fedtree_memory_")
    out["memory_sweep"] = [memory_peak(n) for n in pops] + [
      memory_peak(n, store=os.path.join(stores, f"quickstart_{n}")) for n in pops]
    print("the process's peak as its memory line states it (estimate) against its measured ru_maxrss "
          "(quickstart FedAvg, 2-8 examples per client, resident, then streamed from a store):")
    print(memory_table(out["memory_sweep"]), flush=True)
  tag = args.tag or ("scaling_quick" if args.quick else "scaling")
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, f"{tag}.json"), "w") as f:
    json.dump(out, f, indent=1)
  plot(out, os.path.join(args.out_dir, f"{tag}.png"))
  print(f"wrote {os.path.join(args.out_dir, tag)}.json/.png")
  return out


def plot(out: dict, path: str) -> None:
  """One panel per sweep that ran: time against the cohort, the depth, the population."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cs, ds, ps = out["cohort_sweep"], out["depth_sweep"], out.get("population_sweep") or []
  panels = [name for name, rows in (("cohort", cs), ("depth", ds), ("population", ps)) if rows]
  if not panels:
    return
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
  for ax, name in zip(axes[0], panels, strict=True):
    if name == "cohort":
      ax.loglog([r["cohort"] for r in cs], [r["seconds_per_round"] for r in cs], "o-", label="fedtree")
      k0, t0 = cs[0]["cohort"], cs[0]["seconds_per_round"]
      ax.loglog([r["cohort"] for r in cs], [t0 * r["cohort"] / k0 for r in cs], "k:", label="linear")
      ax.set_xlabel("cohort size (clients per round)")
      ax.set_ylabel("seconds per round")
      ax.set_title(f"FedAvg MLP, population {out['population']:,}")
    elif name == "depth":
      ax.bar([str(r["depth"]) for r in ds], [r["seconds_per_round"] * 1e3 for r in ds])
      ax.set_xlabel("tree depth (server levels above the clients)")
      ax.set_ylabel("ms per round")
      ax.set_title("HierFAVG, 1,000 clients, all levels aggregate")
    else:
      x = [r["population"] for r in ps]
      ax.loglog(x, [r["seconds_per_round"] * 1e3 for r in ps], "o-", label="round (fedtree)")
      ax.loglog(x, [r["draw_s"] * 1e3 for r in ps], "s-", label="cohort draw")
      ax.loglog(x, [r["shuffle_draw_s"] * 1e3 for r in ps], "x:", label="shuffle draw (before)")
      ax.set_xlabel("population (clients)")
      ax.set_ylabel("ms")
      ax.set_title(f"FedAvg MLP, a cohort of {out.get('population_cohort', '?')}")
    if name != "depth":
      ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  t = time.perf_counter()
  main()
  print(f"({time.perf_counter() - t:.0f}s)")
