"""Checkpoints of an algorithm's state with orbax, resumed automatically from the workdir.

A run's state is a pytree of arrays (models, optimizer states, per-client state, the round
counter); the round key is ``fold_in(key, state.round)``, so a resumed run continues exactly
where it stopped. The last ``keep`` checkpoints are kept; a checkpoint that does not restore
(a truncated or zeroed file, broken metadata) is reported, removed, and the next older one is
tried, with one warning line naming the bad checkpoints and the one restored (orbax's own error
logs and the "Event loop is closed" reports of its aborted reads are silenced). Orbax writes a
checkpoint into a temporary folder and renames it when complete, so a
kill during a write leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import jax


def _drop_closed_loop_reports(previous):
  """A ``sys.unraisablehook`` that drops the ``RuntimeError('Event loop is closed')`` which
  orbax's asyncio callbacks raise after a failed restore has closed their loop (one traceback
  per array, hundreds of lines), and passes everything else to ``previous``."""

  def hook(unraisable):
    e = unraisable.exc_value
    if isinstance(e, RuntimeError) and "Event loop is closed" in str(e):
      return
    previous(unraisable)

  hook.fedtree_filter = True
  return hook


@contextlib.contextmanager
def _quiet_restore():
  """Orbax's ERROR logs of a checkpoint that does not restore are left out (the caller names it
  in one line) unless its logs were asked for (``--verbose``: the absl logger at INFO or below);
  the closed-loop reports of its aborted reads are dropped for the rest of the process (they
  arrive after the restore returns)."""
  if not getattr(sys.unraisablehook, "fedtree_filter", False):
    sys.unraisablehook = _drop_closed_loop_reports(sys.unraisablehook)
  log = logging.getLogger("absl")
  level = log.level
  if log.getEffectiveLevel() > logging.INFO:
    log.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    log.setLevel(level)


class CheckpointError(RuntimeError):
  """No checkpoint of a run restores."""


class Checkpointer:
  """Saves ``state`` every ``every`` rounds under ``directory`` (keeping the last ``keep``)."""

  def __init__(self, directory: str, *, every: int, keep: int = 2):
    import orbax.checkpoint as ocp

    if every < 1:
      raise ValueError(f"checkpoint_every={every} must be >= 1 (0 disables checkpoints)")
    if keep < 1:
      raise ValueError(f"keep_checkpoints={keep} must be >= 1")
    self._ocp = ocp
    self.every = int(every)
    self.directory = os.path.abspath(directory)
    with _quiet_restore():  # it reads the checkpoints' metadata
      self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=int(keep))
      )

  def latest_round(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, like: Any, *, warn: Callable[[str], None] = print,
              check: Callable[[Any], str | None] | None = None) -> Any:
    """The newest saved state that restores, shaped like ``like`` (an initialized state);
    ``None`` when there is no checkpoint. Checkpoints that fail, or whose state ``check``
    refuses (it returns why, e.g. a diverged state written by an older version), are named
    through ``warn`` and deleted; raises :class:`CheckpointError` when none restores."""
    with _quiet_restore():
      self._manager.reload()
      steps = sorted(self._manager.all_steps(), reverse=True)
    if not steps:
      return None
    abstract = jax.tree.map(self._ocp.utils.to_shape_dtype_struct, like)
    bad = []
    for step in steps:
      try:
        with _quiet_restore():
          state = self._manager.restore(step, args=self._ocp.args.StandardRestore(abstract))
        if int(state.round) != step:
          raise ValueError(f"holds round {int(state.round)}, not {step}")
        why = check(state) if check is not None else None
        if why is not None:
          raise ValueError(f"its state diverged: {why}")
      except Exception as e:  # noqa: BLE001 (any failure means: this checkpoint is unusable)
        path = os.path.join(self.directory, str(step))
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        bad.append((path, reason))
        continue
      if bad:
        names = (f"checkpoint {bad[0][0]} does not restore ({bad[0][1]})" if len(bad) == 1 else
                 "checkpoints " + "; ".join(f"{p} ({r})" for p, r in bad) + " do not restore")
        warn(f"warning: {names}; restored {os.path.join(self.directory, str(step))} instead "
             f"(the bad {'one is' if len(bad) == 1 else 'ones are'} deleted)")
      for b in steps[: steps.index(step)]:
        self._delete(b)
      return state
    listed = "; ".join(f"{p} ({r})" for p, r in bad)
    raise CheckpointError(
      f"no checkpoint in {self.directory} restores: {listed}. Delete that folder (or run with "
      "--overwrite) to start the run fresh"
    )

  def _delete(self, step: int) -> None:
    try:
      self._manager.delete(step)
    except Exception:  # noqa: BLE001
      shutil.rmtree(os.path.join(self.directory, str(step)), ignore_errors=True)
    self._manager.reload()

  def maybe_save(self, state: Any, *, force: bool = False) -> bool:
    r = int(state.round)
    if not force and r % self.every:
      return False
    if self._manager.latest_step() == r:
      return False
    self._manager.save(r, args=self._ocp.args.StandardSave(state))
    self._manager.wait_until_finished()
    return True

  def close(self) -> None:
    self._manager.close()
