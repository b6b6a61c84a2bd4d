r"""The summary of a GPU session's stage from the files it wrote (issue 41).

  python -m benchmarks.gpu_report issue41 OUT/results [--seconds=S --budget=B]

Reads what ``benchmarks/gpu_session.sh issue41`` leaves under its results folder
(``issue41_pfl_cifar10.json`` from :mod:`benchmarks.pfl_cifar10`, ``issue41_baselines.json`` from
:mod:`benchmarks.methods`, ``param_traffic/analysis.json`` from :mod:`benchmarks.param_traffic`,
``issue41_env.log``) and prints one Markdown page: per item, the headline ratios against the
baseline measured in the same run (pfl-research's seconds per central iteration over fedtree's,
each method's round over FedAvg's in the same turns, the parameter traffic per local step over the
memory floor), then the item's full table as its benchmark printed it. A missing or incomplete
file is named, never skipped silently. Nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _load(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _block(text: str) -> list[str]:
  return ["```", text.rstrip(), "```"]


def pfl_section(res: dict | None) -> list[str]:
  """Item 1: each pfl run's steady wall (and CPU) seconds per central iteration over fedtree's."""
  out = ["## 1. pfl-research beside fedtree in pfl's CIFAR-10 benchmark", ""]
  if res is None:
    return out + ["**missing**: issue41_pfl_cifar10.json (see issue41_pfl.log)"]
  if not res.get("complete", True):
    out.append("**incomplete**: the command stopped before its last run (see issue41_pfl.log)")
  rows = [r for r in res["results"] if "skipped" not in r]
  base = next((r for r in rows if r["runner"] == "fedtree"), None)
  for r in res["results"]:
    if "skipped" in r:
      out.append(f"- {r['label']}: skipped ({r['skipped']})")
  if base is None:
    out.append("- no fedtree run: no ratio")
  else:
    for r in rows:
      if r is base:
        continue
      out.append(f"- {r['label']}: {r['steady_s'] / base['steady_s']:.2f}x fedtree's wall time per central "
                 f"iteration (CPU time {r['steady_cpu_s'] / base['steady_cpu_s']:.2f}x), after "
                 f"{r['iterations']} iterations (fedtree {base['iterations']})")
    pfl = [r for r in rows if r["runner"] == "pfl"]
    if pfl:
      best = min(pfl, key=lambda r: r["steady_s"])
      out.append(f"- **fedtree is {best['steady_s'] / base['steady_s']:.2f}x as fast as pfl-research's best "
                 f"run ({best['label']})** per central iteration (wall, steady state)")
  return out + [""] + _block(res["table"])


def methods_section(res: dict | None) -> list[str]:
  """Item 2: each method's round over FedAvg's in the same turns (wall, then CPU)."""
  out = ["## 2. The baselines' cost against FedAvg's round", ""]
  if res is None:
    return out + ["**missing**: issue41_baselines.json (see issue41_baselines.log)"]
  if not res.get("complete", True):
    out.append(f"**incomplete**: {res['repeats']} turns timed before the command stopped "
               "(see issue41_baselines.log)")
  out.append(f"{res['workload']}, {res['rounds_per_call']} rounds per call, {res['repeats']} interleaved "
             f"turns, on {res.get('device', '?')}; x FedAvg = median over the turns of the method's round "
             "over FedAvg's round in the same turn")
  for r in res["results"]:
    if r["method"] == "fedavg":
      continue
    lo, hi = r["wall_vs_fedavg_range"]
    out.append(f"- {r['method']}: {r['wall_vs_fedavg']:.2f}x FedAvg's round (wall; {lo:.2f}-{hi:.2f}), "
               f"CPU time {r['cpu_vs_fedavg']:.2f}x")
  return out + [""] + _block(res["table"])


def profile_section(res: dict | None) -> list[str]:
  """Item 3: the passes over parameter-sized buffers per local step against the memory floor."""
  out = ["## 3. The profile of workload (a): passes over the clients' parameters", ""]
  if res is None:
    return out + ["**missing**: param_traffic/analysis.json (see issue41_profile.log)"]
  from benchmarks.param_traffic import report

  s = res["summary"]
  if s.get("times_the_floor") is not None:
    out.append(f"- per local step, the parameter-sized traffic is **{s['times_the_floor']:.2f}x the memory "
               f"floor** (one read and one write of each client's parameters): {s['passes_reading']} passes "
               f"read and {s['passes_writing']} write parameter-sized buffers; the step's loop is "
               f"{100 * s['step_share_of_device_time']:.1f} % of the traced op time")
  else:
    out.append("- no local-step loop found in the program: see the passes below")
  lines = report(res).splitlines()
  return out + [""] + _block("\n".join(lines[:4 + 1 + 25]))   # the summary lines and the top 25 passes


def issue41(results: str, seconds: float | None = None, budget: float | None = None) -> str:
  """The Markdown summary of the ``issue41`` stage's ``results`` folder (module docstring)."""
  try:
    with open(os.path.join(results, "issue41_env.log")) as f:
      env = " ".join(f.read().split()) or "(empty issue41_env.log)"
  except OSError:
    env = "(no issue41_env.log)"
  pfl = _load(os.path.join(results, "issue41_pfl_cifar10.json"))
  base = _load(os.path.join(results, "issue41_baselines.json"))
  prof = _load(os.path.join(results, "param_traffic", "analysis.json"))
  device = (pfl or {}).get("device") or (base or {}).get("device") or "?"
  head = f"# Issue 41 on {device}"
  if seconds is not None:
    head += f": {seconds:.0f} s" + (f" of the stage's budget of {budget:.0f} s" if budget is not None else "")
  lines = [head, "", f"Environment: `{env}`", "",
           "Every ratio is against a baseline measured in the same run (fedtree's run, FedAvg's turns, the "
           "memory floor of the same program); absolute times are in the tables only.", ""]
  for section in (pfl_section(pfl), methods_section(base), profile_section(prof)):
    lines += section + [""]
  return "\n".join(lines)


def main(argv=None) -> str:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("stage", choices=("issue41",))
  p.add_argument("results", help="the stage's results folder")
  p.add_argument("--seconds", type=float, default=None, help="the stage's time so far")
  p.add_argument("--budget", type=float, default=None, help="the stage's budget")
  a = p.parse_args(argv)
  text = issue41(a.results, a.seconds, a.budget)
  print(text)
  return text


if __name__ == "__main__":
  main(sys.argv[1:])
