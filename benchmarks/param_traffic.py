r"""A profile of workload (a)'s round and the passes over the clients' parameters in it (issue 41,
item 3).

  python -m benchmarks.param_traffic --clients=10000 --out-dir=OUT       # profile, then analyse
  python -m benchmarks.param_traffic --analyse=OUT/param_traffic          # analyse a saved profile
  python -m benchmarks.param_traffic --tiny --out-dir=/tmp/pt             # a CPU check, ~1 minute

``profile``: FedAvg on workload (a) (:mod:`benchmarks.workloads`: the 60-200-200-10 MLP, 54,410
parameters per client, 4 local steps of batch 16, every client sampled), ``--rounds`` rounds fused
per call and compiled ahead of time; one call warms up, then ``jax.profiler.trace`` records
``--calls`` calls. Saved under ``<out-dir>/param_traffic/``: the trace (``plugins/profile/...
.xplane.pb``, for TensorBoard or Perfetto), the compiled program's optimized HLO (``round.hlo.txt``)
and ``meta.json`` (chunk, per-client parameter shapes, rounds, timings).

``analyse``: reads those files back and lists, for every computation of the program that is not a
fusion's body (the local step's loop body, the chunk loop, the round), each instruction that reads
or writes a buffer of the size of one of the stacked per-client parameter leaves (``[k, 60, 200]``,
``[k, 200]``, ... for a chunk of ``k`` clients, in any layout or reshape: matched by element count,
so gradients, updates and deltas count too), with the bytes it moves and its device time summed
from the trace. Per local step it compares the parameter-sized traffic with the memory floor of
``benchmarks/README.md`` ("Why (a) stays far from the central bound"): one read and one write of
each client's parameters per step (2 x 218 KB per client-step); the instructions past that floor are
the passes a fused step would save. Writes ``<dir>/analysis.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import time

import numpy as np

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TINY = dict(clients=64, rounds=1, calls=1)
"""The CPU check's size."""

_COMP = re.compile(r"^(ENTRY )?%?([\w.\-]+) \((.*)\) -> (.*) \{\s*$")
_INSTR = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
_SHAPE = re.compile(r"(pred|s8|s16|s32|s64|u8|u16|u32|u64|bf16|f16|f32|f64|c64|c128)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4,
          "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "call", "conditional",
        "after-all", "partition-id", "replica-id", "opt-barrier"}
"""Opcodes that move no data themselves (a while's or call's traffic is its body's)."""


# ------------------------------------------------------------------------ the HLO text
def arrays(shape: str) -> list[tuple[str, int]]:
  """``(dtype, elements)`` of every array in an HLO shape string (a tuple gives several)."""
  return [(d, int(np.prod([int(v) for v in dims.split(",") if v]))) for d, dims in _SHAPE.findall(shape)]


def parse_hlo(text: str) -> dict[str, list[dict]]:
  """``{computation: [instruction]}`` of an HLO module's text; an instruction is ``name``,
  ``shape`` (its result), ``opcode``, ``operands`` (names) and ``rest`` (the attributes' text)."""
  comps: dict[str, list[dict]] = {}
  current = None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m:
      current = m.group(2)
      comps[current] = []
      continue
    if line.strip() == "}":
      current = None
      continue
    m = _INSTR.match(line)
    if m and current is not None:
      shape, opcode, rest = m.group(3), m.group(4), m.group(5)
      args, _, attrs = rest.partition(")")
      comps[current].append(dict(name=m.group(2), shape=shape, opcode=opcode, rest=attrs, args=args,
                                 operands=re.findall(r"%([\w.\-]+)", args)))
  return comps


def fused(comps: dict[str, list[dict]]) -> set[str]:
  """Computations that are some fusion's body (or a reduction's or sort's function): their
  instructions run inside the calling instruction, so they are not passes of their own."""
  inner = set()
  for instrs in comps.values():
    for i in instrs:
      for key in ("calls", "to_apply", "comparator"):
        inner.update(re.findall(rf"{key}=%([\w.\-]+)", i["rest"]))
  return inner


def sliced_operands(body: list[dict]) -> dict[int, list[tuple[str, int]]]:
  """``{operand index: arrays it reads}`` of the operands a fusion's ``body`` reads only through slices
  (after bitcasts or reshapes): such an operand moves its slices' bytes, not its own (e.g. one entry of
  each gradient, :func:`fedtree.core.local.after_backward`)."""
  users = collections.defaultdict(list)
  for i in body:
    for o in i["operands"]:
      users[o].append(i)

  def slices(name: str) -> list[dict] | None:
    out: list[dict] = []
    for u in users.get(name, []):
      if u["opcode"] in ("slice", "dynamic-slice"):
        out.append(u)
      elif u["opcode"] in ("bitcast", "reshape") and (inner := slices(u["name"])) is not None:
        out.extend(inner)
      else:
        return None
    return out or None

  found = {}
  for i in body:
    if i["opcode"] == "parameter" and (cut := slices(i["name"])) is not None:
      found[int(i["args"])] = [a for u in cut for a in arrays(u["shape"])]
  return found


def loop_bodies(comps: dict[str, list[dict]]) -> dict[str, str]:
  """``{body computation: the while instruction}`` of every while loop."""
  return {b: i["name"] for instrs in comps.values() for i in instrs
          for b in re.findall(r"body=%([\w.\-]+)", i["rest"])}


def loop_depths(comps: dict[str, list[dict]]) -> dict[str, int]:
  """``{body computation: how many while loops it runs inside}`` (1 for a loop at the top), through
  the calls, conditionals and loops that hold each while instruction."""
  holder = {}   # a called computation -> the computation that calls it
  for comp, instrs in comps.items():
    for i in instrs:
      for b in re.findall(r"(?:body|condition|to_apply|calls|branch_computations)=\{?%([\w.\-]+)", i["rest"]):
        holder.setdefault(b, comp)
      for b in re.findall(r"branch_computations=\{([^}]*)\}", i["rest"]):
        for name in re.findall(r"%([\w.\-]+)", b):
          holder.setdefault(name, comp)
  bodies = loop_bodies(comps)
  out = {}
  for b in bodies:
    d, c, seen = 0, b, set()
    while c is not None and c not in seen:
      seen.add(c)
      d += c in bodies
      c = holder.get(c)
    out[b] = d
  return out


def local_step(comps: dict[str, list[dict]], rows: list[dict]) -> str | None:
  """The local step's loop body: the innermost loop whose body moves parameter-sized bytes (the step's
  loop runs inside the chunk loop, which moves more of them on a GPU: a chunk's broadcast, finiteness
  check and aggregation), the one moving most of them among equally deep ones."""
  per_loop: dict[str, float] = collections.defaultdict(float)
  for r in rows:
    if r["loop"]:
      per_loop[r["computation"]] += r["read_bytes"] + r["write_bytes"]
  depth = loop_depths(comps)
  return max(per_loop, key=lambda c: (depth.get(c, 0), per_loop[c])) if per_loop else None


def param_sizes(leaf_elements: list[int], chunk: int) -> set[int]:
  """Element counts of a chunk's stacked per-client parameter leaves (and of all of them
  concatenated, ``[k, P]``, e.g. one flat vector per client)."""
  return {chunk * n for n in leaf_elements} | {chunk * int(sum(leaf_elements))}


def passes(comps: dict[str, list[dict]], sizes: set[int]) -> list[dict]:
  """Every instruction outside fusion bodies that reads or writes a parameter-sized buffer."""
  inner = fused(comps)
  shapes = {i["name"]: i["shape"] for instrs in comps.values() for i in instrs}
  bodies = loop_bodies(comps)
  rows = []
  for comp, instrs in comps.items():
    if comp in inner:
      continue
    for i in instrs:
      if i["opcode"] in FREE:
        continue
      body = re.search(r"calls=%([\w.\-]+)", i["rest"]) if i["opcode"] == "fusion" else None
      through = sliced_operands(comps.get(body.group(1), [])) if body else {}
      reads = [(n, d, e) for j, n in enumerate(i["operands"])
               for d, e in through.get(j, arrays(shapes.get(n, ""))) if e in sizes]
      writes = [(d, e) for d, e in arrays(i["shape"]) if e in sizes]
      if not reads and not writes:
        continue
      kind = re.search(r"kind=(\w+)", i["rest"])
      target = re.search(r'custom_call_target="([^"]+)"', i["rest"])
      rows.append(dict(computation=comp, loop=bodies.get(comp), name=i["name"], opcode=i["opcode"],
                       kind=(kind.group(1) if kind else target.group(1) if target else ""),
                       reads=len(reads), writes=len(writes), read_sizes=[e for _, _, e in reads],
                       write_sizes=[e for _, e in writes],
                       read_bytes=sum(e * _BYTES[d] for _, d, e in reads),
                       write_bytes=sum(e * _BYTES[d] for d, e in writes)))
  return rows


# ------------------------------------------------------------------------ the trace
def trace_times(trace_dir: str) -> dict[str, dict]:
  """``{instruction name: {"ns": total duration, "count": events}}`` from the newest
  ``.xplane.pb`` under ``trace_dir``: a GPU's ``XLA Ops`` lines, or the host threads that ran
  XLA:CPU's thunks (events named after the HLO instructions)."""
  import jax

  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
                 key=os.path.getmtime)
  if not files:
    return {}
  data = jax.profiler.ProfileData.from_file(files[-1])
  out: dict[str, dict] = collections.defaultdict(lambda: {"ns": 0.0, "count": 0})
  for plane in data.planes:
    lines = list(plane.lines)
    ops = [ln for ln in lines if ln.name == "XLA Ops"]
    for line in ops or (lines if plane.name.startswith("/host") else []):
      for e in line.events:
        if e.name.startswith("end: "):
          continue
        out[e.name]["ns"] += e.duration_ns
        out[e.name]["count"] += 1
  return dict(out)


# ------------------------------------------------------------------------ profile and analysis
def profile(clients: int, rounds: int, calls: int, out_dir: str, chunk_size="auto") -> str:
  """Profiles workload (a) at ``clients`` clients (module docstring); returns the directory."""
  import jax

  from benchmarks import workloads
  from benchmarks.jax_runners import build_fedtree, federated_data
  from fedtree.core.loop import compile_rounds

  directory = os.path.join(out_dir, "param_traffic")
  os.makedirs(directory, exist_ok=True)
  w = workloads.mlp(clients)
  data = federated_data(w)
  alg, chunk = build_fedtree(w, data, chunk_size=chunk_size)
  state = alg.init(jax.random.key(w.seed))
  key = jax.random.key(w.seed + 1)
  t = time.perf_counter()
  compiled = compile_rounds(alg, rounds).lower(state, data, key).compile()
  compile_s = time.perf_counter() - t
  with open(os.path.join(directory, "round.hlo.txt"), "w") as f:
    f.write(compiled.as_text())
  state, m = compiled(state, data, jax.random.fold_in(key, 0))
  jax.block_until_ready((state, m))
  t = time.perf_counter()
  with jax.profiler.trace(directory):
    for c in range(calls):
      state, m = compiled(state, data, jax.random.fold_in(key, c + 1))
      jax.block_until_ready((state, m))
  traced_s = time.perf_counter() - t
  leaves = jax.tree.leaves(jax.tree.map(lambda a: a[0], state.params[0]))
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  meta = dict(clients=clients, rounds_per_call=rounds, calls=calls, chunk=int(chunk),
              local_steps=w.local_steps,
              leaf_shapes=[list(a.shape) for a in leaves], leaf_elements=[int(a.size) for a in leaves],
              param_bytes_per_client=int(sum(a.size * a.dtype.itemsize for a in leaves)),
              backend=jax.default_backend(), device=jax.devices()[0].device_kind, jax_version=jax.__version__,
              compile_s=compile_s, traced_s=traced_s, seconds_per_round=traced_s / (calls * rounds),
              xla_flags=os.environ.get("XLA_FLAGS", ""),
              bytes_accessed_per_call=float(cost.get("bytes accessed", float("nan"))) if cost else None)
  with open(os.path.join(directory, "meta.json"), "w") as f:
    json.dump(meta, f, indent=1)
  return directory


def analyse(directory: str) -> dict:
  """The passes over parameter-sized buffers of the profile in ``directory`` (module docstring)."""
  with open(os.path.join(directory, "meta.json")) as f:
    meta = json.load(f)
  with open(os.path.join(directory, "round.hlo.txt")) as f:
    comps = parse_hlo(f.read())
  rows = passes(comps, param_sizes(meta["leaf_elements"], meta["chunk"]))
  times = trace_times(directory)
  inner = fused(comps)
  ops = {i["name"] for c, instrs in comps.items() if c not in inner
         for i in instrs if i["opcode"] not in FREE}
  total_ns = sum(v["ns"] for n, v in times.items() if n in ops) or float("nan")   # the program's own ops
  for r in rows:
    t = times.get(r["name"], {"ns": 0.0, "count": 0})
    r["device_ms"], r["events"] = t["ns"] / 1e6, t["count"]
    r["share"] = t["ns"] / total_ns
  step = local_step(comps, rows)
  step_rows = [r for r in rows if r["computation"] == step]
  k, pb = meta["chunk"], meta["param_bytes_per_client"]
  moved = sum(r["read_bytes"] + r["write_bytes"] for r in step_rows)
  summary = dict(step_computation=step, chunk=k, param_bytes_per_client=pb,
                 floor_bytes_per_client_step=2 * pb,
                 moved_bytes_per_client_step=moved / k if k else None,
                 times_the_floor=moved / (2 * pb * k) if k and pb else None,
                 passes_reading=sum(r["reads"] > 0 for r in step_rows),
                 passes_writing=sum(r["writes"] > 0 for r in step_rows),
                 step_share_of_device_time=sum(r["share"] for r in step_rows),
                 traced_ops=len(times), seconds_per_round=meta["seconds_per_round"])
  # Per stacked leaf (leaves of one size, e.g. two [k, 200] biases, are told apart by nothing but their
  # name, so their passes are shared out evenly).
  same = collections.Counter(meta["leaf_elements"])
  summary["per_leaf"] = {f"[{k}, {', '.join(map(str, shape))}]": dict(
    reads=sum(r["read_sizes"].count(k * n) for r in step_rows) / same[n],
    writes=sum(r["write_sizes"].count(k * n) for r in step_rows) / same[n])
    for n, shape in zip(meta["leaf_elements"], meta["leaf_shapes"], strict=True)}
  result = dict(meta=meta, summary=summary, passes=rows)
  with open(os.path.join(directory, "analysis.json"), "w") as f:
    json.dump(result, f, indent=1)
  return result


def report(result: dict) -> str:
  meta, s = result["meta"], result["summary"]
  lines = [f"workload (a): {meta['clients']} clients, chunk {meta['chunk']}, {meta['local_steps']} local "
           f"steps; {meta['backend']} ({meta['device']}); "
           f"{meta['seconds_per_round'] * 1e3:.2f} ms per round traced",
           f"per-client parameters {s['param_bytes_per_client'] / 1e3:.1f} KB; memory floor per local step "
           f"(read + write once) {s['floor_bytes_per_client_step'] / 1e3:.1f} KB per client",
           f"local step loop body: {s['step_computation']}: {s['passes_reading']} passes read and "
           f"{s['passes_writing']} write parameter-sized buffers; "
           + (f"{s['moved_bytes_per_client_step'] / 1e3:.1f} KB per client-step = "
              f"{s['times_the_floor']:.2f}x the floor; "
              if s["moved_bytes_per_client_step"] is not None else "")
           + f"{100 * s['step_share_of_device_time']:.1f} % of the traced op time",
           "leaves written once per local step (the floor; for a weight matrix, its SGD update folded into "
           "its gradient's GEMM, which XLA:CPU never emits): "
           f"{sum(v['writes'] <= 1 for v in s['per_leaf'].values())} of {len(s['per_leaf'])}",
           "per local step, passes reading / writing each stacked leaf (the floor: 1 / 1): "
           + ", ".join(f"{shape} {v['reads']:g}/{v['writes']:g}" for shape, v in s["per_leaf"].items()),
           f"{'computation':34s} {'instruction':34s} {'opcode/kind':28s} {'rd':>3s} {'wr':>3s} "
           f"{'MB read':>9s} {'MB written':>10s} {'ms':>9s} {'time %':>7s}"]
  order = sorted(result["passes"], key=lambda r: (r["computation"] != s["step_computation"], -r["device_ms"]))
  for r in order:
    what = (r["opcode"] + " " + r["kind"])[:28]
    lines.append(f"{r['computation'][:34]:34s} {r['name'][:34]:34s} {what:28s} {r['reads']:3d} "
                 f"{r['writes']:3d} {r['read_bytes'] / 1e6:9.2f} {r['write_bytes'] / 1e6:10.2f} "
                 f"{r['device_ms']:9.3f} {100 * r['share']:7.2f}")
  return "\n".join(lines)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tiny", action="store_true", help=f"the CPU check: {TINY}")
  p.add_argument("--clients", type=int, default=10_000)
  p.add_argument("--rounds", type=int, default=2, help="rounds fused per call")
  p.add_argument("--calls", type=int, default=2, help="calls traced")
  p.add_argument("--chunk-size", default="auto")
  p.add_argument("--out-dir", default=RESULTS)
  p.add_argument("--analyse", default=None, help="analyse this saved profile directory only")
  a = p.parse_args(argv)
  if a.tiny:
    for k, v in TINY.items():
      if getattr(a, k) == p.get_default(k):
        setattr(a, k, v)
  directory = a.analyse or profile(a.clients, a.rounds, a.calls, a.out_dir,
                                   a.chunk_size if a.chunk_size == "auto" else int(a.chunk_size))
  result = analyse(directory)
  print(report(result))
  print(f"wrote {directory}/analysis.json", file=sys.stderr)
  return result


if __name__ == "__main__":
  main()
