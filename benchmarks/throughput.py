r"""Throughput of fedtree against PyTorch simulators, side by side in one run.

  python -m benchmarks.throughput --quick                 # ~1 minute: (a) at 100, (c) at 100
  python -m benchmarks.throughput --all                   # workloads (a), (b), (c) in full
  python -m benchmarks.throughput --workload=a --clients=1000
  python -m benchmarks.throughput --workload=b
  python -m benchmarks.throughput --workload=c
  python -m benchmarks.throughput --workload=scale --clients=100000   # persistent client state

Every (workload, framework) pair runs in its own subprocess, so peak memory (RSS of the
process and its children, e.g. Ray workers) is per framework; the parent prints a table of
rounds/s, client-updates/s, examples/s, peak memory and the ratio of fedtree to each peer,
and writes ``benchmarks/results/<tag>.json`` and ``.png``. How far from the hardware: the device's
peaks are measured first (:mod:`benchmarks.hardware`: a float32 GEMM and a copy, on this machine),
and every JAX row (fedtree, the central bound) states its achieved FLOP/s and bytes/s as a fraction
of them, the round's work costed by XLA on one compiled client step. Frameworks:

* ``fedtree``: this library (chunked, fused, donated rounds; ``--chunk-size``,
  ``--compute-dtype``, ``--cpu-devices`` to shard clients over N host devices);
* ``central``: the same examples trained by one JAX model (batch ``cohort x B``), the
  zero-overhead bound;
* ``torch``: a plain per-client PyTorch loop (what FLSim/PFLlib-style simulators do);
* ``flower``: Flower's simulation engine (``flwr[simulation]``, Ray) with the same PyTorch
  clients; skipped with the reason printed when it cannot be imported or run.

Timings are never asserted anywhere; ``tests/test_benchmarks.py`` only runs the smallest
setting in-process so this script cannot rot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import threading
import time
import traceback

from benchmarks import workloads
from benchmarks.workloads import Workload

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
FRAMEWORKS = ("fedtree", "central", "torch", "flower")


@dataclasses.dataclass(frozen=True)
class Job:
  """One measurement: a framework on a workload (``variant`` labels fedtree options)."""

  workload: Workload
  framework: str
  rounds: int
  repeats: int = 2
  options: tuple = ()          # (key, value) pairs for the runner
  variant: str = ""

  @property
  def label(self) -> str:
    return self.framework + (f"[{self.variant}]" if self.variant else "")


# ------------------------------------------------------------------------ one job
class PeakRSS:
  """Peak resident memory of this process and all its descendants (sampled every 50 ms)."""

  def __init__(self):
    self.peak = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _sample(self) -> int:
    import psutil

    p = psutil.Process()
    total = p.memory_info().rss
    for child in p.children(recursive=True):
      try:
        total += child.memory_info().rss
      except Exception:  # noqa: BLE001 - processes come and go
        pass
    return total

  def _run(self):
    while not self._stop.is_set():
      try:
        self.peak = max(self.peak, self._sample())
      except Exception:  # noqa: BLE001
        pass
      self._stop.wait(0.05)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    self.peak = max(self.peak, own)
    return False


def run_job(job: Job) -> dict:
  """Runs one job in this process; returns its measurements (or ``skipped`` with a reason)."""
  w, opts = job.workload, dict(job.options)
  out = dict(workload=dataclasses.asdict(w), framework=job.framework, variant=job.variant,
             label=job.label, setting=w.label())
  try:
    with PeakRSS() as mem:
      if job.framework == "fedtree":
        from benchmarks.jax_runners import run_fedtree

        res = run_fedtree(w, rounds=job.rounds, repeats=job.repeats, **opts)
      elif job.framework == "central":
        from benchmarks.jax_runners import run_central

        res = run_central(w, rounds=job.rounds, repeats=job.repeats,
                          **{k: v for k, v in opts.items() if k == "conv_impl"})
      elif job.framework == "torch":
        from benchmarks.peers import run_torch_loop

        res = run_torch_loop(w, rounds=job.rounds, **opts)
      elif job.framework == "flower":
        try:
          import flwr  # noqa: F401
          import ray  # noqa: F401
        except Exception as e:  # noqa: BLE001
          return {**out, "skipped": f"flwr[simulation] is not importable: {e!r}; "
                                    "pip install -e '.[bench]'"}
        from benchmarks.peers import run_flower

        res = run_flower(w, rounds=job.rounds)
      else:
        raise ValueError(f"framework={job.framework!r}; choose one of {FRAMEWORKS}")
  except Exception as e:  # noqa: BLE001 - reported in the table, the other jobs go on
    return {**out, "skipped": f"{type(e).__name__}: {e}"[:400],
            "traceback": traceback.format_exc()[-2000:]}
  sec = res["seconds_per_round"]
  if job.framework in ("fedtree", "central"):   # the round's work, from one compiled client step
    res = {**res, **round_work(w)}
  return {**out, **res, "rounds_per_s": 1.0 / sec,
          "client_updates_per_s": w.cohort_size / sec,
          "examples_per_s": w.examples_per_round / sec,
          "peak_rss_mb": mem.peak / 2**20}


def round_work(w: Workload) -> dict:
  """``round_flops`` and ``round_bytes``: ``cohort x local_steps`` client steps of ``w``, each costed by
  XLA on its own compiled program (:func:`benchmarks.hardware.client_step_cost`)."""
  import optax

  from benchmarks.hardware import client_step_cost
  from benchmarks.jax_runners import jax_model

  step = client_step_cost(jax_model(w), optax.sgd(w.lr), w.example_shape, w.batch_size)
  n = w.cohort_size * w.local_steps
  return dict(round_flops=step["flops"] * n, round_bytes=step["bytes"] * n)


def with_fractions(results: list[dict], peak: dict) -> list[dict]:
  """Every timed JAX row with its achieved FLOP/s and bytes/s as fractions of ``peak``
  (:func:`benchmarks.hardware.peaks`)."""
  from benchmarks.hardware import fractions

  out = []
  for r in results:
    if "round_flops" in r and "skipped" not in r:
      step = dict(flops=r["round_flops"], bytes=r["round_bytes"])
      r = {**r, **fractions(step, 1, r["seconds_per_round"], peak)}
    out.append(r)
  return out


def run_job_subprocess(job: Job, timeout: float) -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(
    os.pathsep) if p])
  devices = dict(job.options).get("mesh_devices")
  if devices:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={devices}").strip()
  payload = json.dumps(_job_to_json(job))
  try:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--worker", payload],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
  except subprocess.TimeoutExpired:
    return dict(label=job.label, framework=job.framework, variant=job.variant,
                setting=job.workload.label(), workload=dataclasses.asdict(job.workload),
                skipped=f"timed out after {timeout:.0f}s")
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  if not lines:
    return dict(label=job.label, framework=job.framework, variant=job.variant,
                setting=job.workload.label(), workload=dataclasses.asdict(job.workload),
                skipped=f"worker failed (rc={proc.returncode}): {proc.stderr.strip()[-400:]}")
  return json.loads(lines[-1][len("RESULT "):])


def _job_to_json(job: Job) -> dict:
  return dict(workload=dataclasses.asdict(job.workload), framework=job.framework,
              rounds=job.rounds, repeats=job.repeats, options=[list(o) for o in job.options],
              variant=job.variant)


def _job_from_json(d: dict) -> Job:
  wd = dict(d["workload"])
  wd["example_shape"] = tuple(wd["example_shape"])
  return Job(workload=Workload(**wd), framework=d["framework"], rounds=d["rounds"],
             repeats=d["repeats"], options=tuple(tuple(o) for o in d["options"]),
             variant=d["variant"])


# ------------------------------------------------------------------------ plans
def fedtree_rounds(w: Workload) -> int:
  """Rounds fused per timed call: about 4,000 client updates (at least 1, at most 20)."""
  # CNN: one round, timed once; XLA:CPU runs convolutions inside loops slowly (README).
  return max(1, min(20, 4000 // w.cohort_size)) if w.model == "mlp" else 1


def peer_rounds(w: Workload) -> int:
  return 1 if w.cohort_size >= 1000 else 2


def jobs_for(w: Workload, frameworks, *, flower_max_clients: int, fedtree_opts=(),
             variants=(), torch_opts=(), torch_max_clients: int | None = None) -> list[Job]:
  jobs = []
  for fw in frameworks:
    reps = 2 if w.model == "mlp" else 1
    if fw == "fedtree":
      jobs.append(Job(w, "fedtree", fedtree_rounds(w), reps, options=tuple(fedtree_opts)))
      for name, opts in variants:
        jobs.append(Job(w, "fedtree", fedtree_rounds(w), reps, options=tuple(opts), variant=name))
    elif fw == "central":
      jobs.append(Job(w, "central", fedtree_rounds(w), reps))
      for name, opts in variants:   # the convolution path changes the bound too
        if "conv_impl" in dict(opts):
          jobs.append(Job(w, "central", fedtree_rounds(w), reps, options=tuple(opts), variant=name))
    elif fw == "torch":
      if torch_max_clients is not None and w.cohort_size > torch_max_clients:
        jobs.append(Job(w, "torch", 0, options=(("skip", f"cohort {w.cohort_size} > "
                                                 f"--torch-max-clients={torch_max_clients}"),)))
      else:
        jobs.append(Job(w, "torch", peer_rounds(w), options=tuple(torch_opts)))
    elif fw == "flower":
      if w.num_clients > flower_max_clients:
        jobs.append(Job(w, "flower", 0, options=(("skip", f"{w.num_clients} clients > "
                                                   f"--flower-max-clients={flower_max_clients}"),)))
      else:
        jobs.append(Job(w, "flower", peer_rounds(w)))
  return jobs


def plan(args) -> list[Job]:
  fws = [f for f in args.frameworks.split(",") if f]
  for f in fws:
    if f not in FRAMEWORKS:
      raise SystemExit(f"--frameworks: {f!r} is unknown; choose from {FRAMEWORKS}")
  opts = []
  if args.chunk_size != "auto":
    opts.append(("chunk_size", None if args.chunk_size == "none" else int(args.chunk_size)))
  if args.compute_dtype:
    opts.append(("compute_dtype", args.compute_dtype))
  if args.cpu_devices > 1:
    opts.append(("mesh_devices", args.cpu_devices))
  variants = []
  if args.variants:
    variants = [("bf16", (("compute_dtype", "bfloat16"),))]
    if args.workload == "b" or args.all:   # the convolution path: lax.conv vs im2col matmuls
      variants += [(f"conv={c}", (("conv_impl", c),)) for c in ("xla", "matmul")]
  for c in (int(v) for v in args.chunk_sweep.split(",") if v):
    variants.append((f"chunk={c}", (("chunk_size", c),)))
  fm = args.flower_max_clients
  tm = args.torch_max_clients
  if args.quick:  # (b) is left out: its CPU round takes minutes (README, workload (b))
    return (jobs_for(workloads.mlp(100), fws, flower_max_clients=fm, fedtree_opts=opts)
            + tree_jobs(workloads.tree(100, edges=10), opts))
  if args.all:
    jobs = []
    for c in (100, 1000, 10000):
      jobs += jobs_for(workloads.mlp(c), fws, flower_max_clients=fm, fedtree_opts=opts,
                       variants=variants if c == 1000 else ())
    jobs += jobs_for(workloads.cnn(1000), fws, flower_max_clients=fm, fedtree_opts=opts)
    return jobs + tree_jobs(workloads.tree(1000), opts)
  if args.workload == "a":
    return jobs_for(workloads.mlp(args.clients or 1000), fws, flower_max_clients=fm,
                    fedtree_opts=opts, variants=variants, torch_max_clients=tm)
  if args.workload == "b":
    return jobs_for(workloads.cnn(args.clients or 1000), fws, flower_max_clients=fm,
                    fedtree_opts=opts, variants=variants, torch_max_clients=tm)
  if args.workload == "c":
    return tree_jobs(workloads.tree(args.clients or 1000), opts)
  if args.workload == "scale":
    c = args.clients or 100_000
    w = dataclasses.replace(workloads.mlp(c), name="scale",
                            cohort=args.cohort if args.cohort else None)
    return [Job(w, "fedtree", 1, repeats=1, options=tuple(opts) + (("persistent_state", True),),
                variant="persistent")]
  raise SystemExit(f"--workload={args.workload!r}; choose a, b, c or scale (or --quick/--all)")


def tree_jobs(w: Workload, opts) -> list[Job]:
  flat = dataclasses.replace(w, edges=None)
  r = fedtree_rounds(w)
  return [Job(flat, "fedtree", r, options=tuple(opts), variant="flat"),
          Job(w, "fedtree", r, options=tuple(opts), variant="3-tier")]


# ------------------------------------------------------------------------ report
def table(results: list[dict]) -> str:
  """The printed comparison: one block per setting, ratios of fedtree to every peer."""
  lines = []
  hdr = (f"{'framework':<22}{'rounds/s':>10}{'client-upd/s':>14}{'examples/s':>13}"
         f"{'peak MB':>10}{'compile s':>11}  fedtree/this")
  settings = list(dict.fromkeys(_group(r) for r in results))
  for s in settings:
    rows = [r for r in results if _group(r) == s]
    base = next((r for r in rows if r["framework"] == "fedtree" and "skipped" not in r
                 and r["variant"] in ("", "flat", "persistent")), None)
    lines += ["", s, hdr, "-" * len(hdr)]
    for r in rows:
      if "skipped" in r:
        lines.append(f"{r['label']:<22}  skipped: {r['skipped']}")
        continue
      ratio = ""
      if base is not None and r is not base:
        ratio = f"{base['client_updates_per_s'] / r['client_updates_per_s']:.2f}x"
        if r["framework"] == "central":
          ratio += (f"  (fedtree reaches {100 * base['examples_per_s'] / r['examples_per_s']:.0f}"
                    "% of the central bound)")
        if r["variant"] == "3-tier":
          ratio = (f"3-tier round = {r['seconds_per_round'] / base['seconds_per_round']:.2f}x "
                   "the flat round")
      if "flops_fraction" in r:   # how far from the hardware (benchmarks.hardware)
        ratio = (f"{100 * r['flops_fraction']:.1f}% peak FLOP/s, {100 * r['bytes_fraction']:.0f}% cache B/s"
                 + (f"; {ratio}" if ratio else ""))
      comp = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
      cu = r["client_updates_per_s"]
      lines.append(f"{r['label']:<22}{r['rounds_per_s']:>10.3f}{cu:>14.{0 if cu >= 10 else 2}f}"
                   f"{r['examples_per_s']:>13.0f}{r['peak_rss_mb']:>10.0f}{comp:>11}  {ratio}")
  return "\n".join(lines)


def _group(r: dict) -> str:
  """Table block of a result: its setting, with the flat and 3-tier rounds of (c) together."""
  if r.get("variant") in ("flat", "3-tier"):
    return r["setting"].split(", tree")[0] + " (flat vs 3-tier tree of 10 edges)"
  return r["setting"]


def plot(results: list[dict], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ok = [r for r in results if "skipped" not in r]
  settings = list(dict.fromkeys(r["setting"] for r in ok))
  labels = list(dict.fromkeys(r["label"] for r in ok))
  fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(settings)), 4.5))
  width = 0.8 / max(1, len(labels))
  for i, lab in enumerate(labels):
    xs, ys = [], []
    for j, s in enumerate(settings):
      r = next((r for r in ok if r["setting"] == s and r["label"] == lab), None)
      if r:
        xs.append(j + i * width)
        ys.append(r["client_updates_per_s"])
    ax.bar(xs, ys, width, label=lab)
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(settings))])
  ax.set_xticklabels([s.replace(", ", "\n", 2) for s in settings], fontsize=7)
  ax.set_yscale("log")
  ax.set_ylabel("client updates / s (log)")
  ax.set_title("fedtree vs PyTorch simulators (higher is better)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def machine() -> dict:
  import platform

  info = dict(python=platform.python_version(), cpus=os.cpu_count(), platform=platform.platform())
  try:
    import jax

    info["jax"] = jax.__version__
    info["backend"] = jax.default_backend()
  except Exception:  # noqa: BLE001
    pass
  try:
    import torch

    info["torch"] = torch.__version__
    if torch.cuda.is_available():
      info["gpu"] = torch.cuda.get_device_name()
  except Exception:  # noqa: BLE001
    pass
  try:
    info["load_avg"] = os.getloadavg()
  except OSError:
    pass
  return info


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--workload", default="a", help="a | b | c | scale")
  p.add_argument("--clients", type=int, default=None)
  p.add_argument("--cohort", type=int, default=None, help="scale mode: clients per round")
  p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
  p.add_argument("--quick", action="store_true", help="small settings, ~2 minutes")
  p.add_argument("--all", action="store_true", help="every workload at every size")
  p.add_argument("--chunk-size", default="auto", help="auto | none | an int")
  p.add_argument("--compute-dtype", default=None, help="e.g. bfloat16 (fedtree local training)")
  p.add_argument("--variants", action="store_true", help="also time fedtree with bf16")
  p.add_argument("--cpu-devices", type=int, default=0,
                 help="fedtree: shard clients over N host devices (XLA_FLAGS device count); "
                      "0 (default): one per CPU core (1 with --in-process)")
  p.add_argument("--flower-max-clients", type=int, default=1000)
  p.add_argument("--torch-threads", type=int, default=0,
                 help="intra-op threads of the PyTorch loop; 0 (default): one per CPU core, "
                      "the same cores fedtree uses")
  p.add_argument("--torch-device", default="auto",
                 help="the PyTorch loop's device: auto (cuda when available) | cpu | cuda")
  p.add_argument("--torch-max-clients", type=int, default=None,
                 help="skip the PyTorch loop above this cohort (its per-client rate is constant)")
  p.add_argument("--chunk-sweep", default="",
                 help="comma-separated chunk sizes: one fedtree[chunk=N] variant each")
  p.add_argument("--fused-rounds", type=int, default=None,
                 help="rounds fused per call of the JAX jobs (fedtree, central; override)")
  p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
  p.add_argument("--rounds", type=int, default=None, help="timed rounds per job (override)")
  p.add_argument("--repeats", type=int, default=None, help="timed calls per JAX job (best kept)")
  p.add_argument("--in-process", action="store_true", help="no subprocesses (tests)")
  p.add_argument("--tag", default=None, help="results file name (default from the flags)")
  p.add_argument("--out-dir", default=RESULTS, help="where the JSON and PNG go")
  p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)

  if args.worker:
    job = _job_from_json(json.loads(args.worker))
    skip = dict(job.options).get("skip")
    res = (dict(label=job.label, framework=job.framework, variant=job.variant,
                setting=job.workload.label(), workload=dataclasses.asdict(job.workload),
                skipped=skip) if skip else run_job(job))
    print("RESULT " + json.dumps(res), flush=True)
    return [res]

  if args.cpu_devices == 0:
    args.cpu_devices = 1 if args.in_process else (os.cpu_count() or 1)
  if args.torch_threads == 0:
    args.torch_threads = os.cpu_count() or 1
  jobs = plan(args)
  if args.torch_threads:
    jobs = [dataclasses.replace(j, options=(("threads", args.torch_threads),
                                            ("device", args.torch_device)))
            if j.framework == "torch" and not dict(j.options).get("skip") else j for j in jobs]
  if args.fused_rounds:
    jobs = [dataclasses.replace(j, rounds=args.fused_rounds)
            if j.framework in ("fedtree", "central") else j for j in jobs]
  if args.rounds or args.repeats:
    jobs = [dataclasses.replace(j, rounds=args.rounds or j.rounds,
                                repeats=args.repeats or j.repeats) for j in jobs]
  from benchmarks.hardware import describe, peaks

  peak = peaks()   # before the jobs, on the machine as they find it
  print(f"peaks: {describe(peak)}", flush=True)
  results = []
  t0 = time.perf_counter()
  for job in jobs:
    skip = dict(job.options).get("skip")
    print(f"[{time.perf_counter() - t0:6.0f}s] {job.workload.label()} :: {job.label} ...",
          flush=True)
    if skip:
      res = dict(label=job.label, framework=job.framework, variant=job.variant,
                 setting=job.workload.label(), workload=dataclasses.asdict(job.workload),
                 skipped=skip)
    else:
      res = run_job(job) if args.in_process else run_job_subprocess(job, args.timeout)
    if "skipped" in res:
      print(f"    skipped: {res['skipped']}", flush=True)
    else:
      print(f"    {res['client_updates_per_s']:.0f} client-updates/s, "
            f"{res['peak_rss_mb']:.0f} MB peak", flush=True)
    results.append(res)
  results = with_fractions(results, peak)
  text = f"peaks: {describe(peak)}\n" + table(results)
  print(text)
  tag = args.tag or ("quick" if args.quick else "all" if args.all else
                     f"{args.workload}_{args.clients or 'default'}")
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, f"{tag}.json"), "w") as f:
    json.dump(dict(machine=machine(), peaks=peak, argv=sys.argv[1:] if argv is None else list(argv),
                   results=results, table=text), f, indent=1)
  try:
    plot(results, os.path.join(args.out_dir, f"{tag}.png"))
  except Exception as e:  # noqa: BLE001 - the table and JSON are the results; the plot is extra
    print(f"(no plot: {e})")
  print(f"\nwrote {os.path.join(args.out_dir, tag)}.json/.png ({time.perf_counter() - t0:.0f}s)")
  return results


if __name__ == "__main__":
  main()
