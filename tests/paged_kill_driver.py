"""A run of rounds over a paged per-client state, checkpointed with orbax, that can SIGKILL itself
at a chosen point (tests/test_population_paged.py's kill-and-resume tests).

  python tests/paged_kill_driver.py WORKDIR [KILL_ROUND WHERE]

Every round draws a cohort (seeded by the round), gathers its rows, updates them and scatters them
back; every ``EVERY`` rounds the paged state is committed and its snapshot saved with the round in
the run's orbax checkpoint. A rerun resumes from the latest checkpoint. ``WHERE``:
``mid_scatter`` (half the cohort's rows written), ``after_scatter`` (all written, before the next
round), ``after_commit`` (committed, its checkpoint not yet saved). At the end every client's row
is written to ``WORKDIR/final.npz``.
"""

import os
import signal
import sys

import numpy as np

NUM_CLIENTS, COHORT, ROUNDS, EVERY = 500, 40, 7, 2


def init(ids):
  ids = np.asarray(ids)
  return {"c": np.stack([np.sin(ids), np.cos(ids)], 1).astype(np.float32), "k": (ids % 7).astype(np.int32)}


def update(rows, ids, round_):
  return {"c": rows["c"] * np.float32(0.9) + np.float32(round_) / (ids[:, None] + 1).astype(np.float32),
          "k": rows["k"] + 1}


def run(workdir, kill_round=None, where=None, die=None):
  """The run; ``die`` stops it at the kill point (default: SIGKILL of this process)."""
  from flax import struct

  from fedtree.experiment.checkpoint import Checkpointer
  from fedtree.population.paged import PagedState

  @struct.dataclass
  class Saved:
    round: np.ndarray
    slots: np.ndarray
    generation: np.ndarray

  if die is None:
    def die():
      os.kill(os.getpid(), signal.SIGKILL)

  state = PagedState(init, NUM_CLIENTS, directory=os.path.join(workdir, "paged"), chunk_bytes=64)
  ckpt = Checkpointer(os.path.join(workdir, "ckpt"), every=EVERY, keep=2)
  like = state.snapshot_like()
  saved = ckpt.restore(Saved(round=np.asarray(0), slots=like.slots, generation=like.generation))
  start = 0
  if saved is not None:
    state.restore(type(like)(slots=saved.slots, generation=saved.generation))
    start = int(saved.round)
  for r in range(start, ROUNDS):
    ids = np.random.default_rng([0, r]).choice(NUM_CLIENTS, COHORT, replace=False)
    new = update(state.gather(ids), ids, r)
    if r + 1 == kill_round and where == "mid_scatter":
      half = COHORT // 2
      state.scatter(ids[:half], {k: v[:half] for k, v in new.items()})
      die()
    state.scatter(ids, new)
    if r + 1 == kill_round and where == "after_scatter":
      die()
    if (r + 1) % EVERY == 0:
      snap = state.commit()
      if r + 1 == kill_round and where == "after_commit":
        die()
      ckpt.maybe_save(Saved(round=np.asarray(r + 1), slots=snap.slots, generation=snap.generation))
  ckpt.close()
  final = state.gather(np.arange(NUM_CLIENTS))
  np.savez(os.path.join(workdir, "final.npz"), **final)
  return final


if __name__ == "__main__":
  args = sys.argv[1:]
  run(args[0], int(args[1]) if len(args) > 1 else None, args[2] if len(args) > 2 else None)
