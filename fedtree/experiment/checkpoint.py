"""Checkpoints of an algorithm's state with orbax, resumed automatically from the workdir.

A run's state is a pytree of arrays (models, optimizer states, per-client state, the round
counter); the round key is ``fold_in(key, state.round)``, so a resumed run continues exactly
where it stopped. The last ``keep`` checkpoints are kept; a checkpoint that does not restore
(a truncated or zeroed file, broken metadata) is reported, removed, and the next older one is
tried. Orbax writes a checkpoint into a temporary folder and renames it when complete, so a
kill during a write leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import jax


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
    steps = sorted(self._manager.all_steps(), reverse=True)
    if not steps:
      return None
    abstract = jax.tree.map(self._ocp.utils.to_shape_dtype_struct, like)
    bad = []
    for step in steps:
      try:
        state = self._manager.restore(step, args=self._ocp.args.StandardRestore(abstract))
        if int(state.round) != step:
          raise ValueError(f"holds round {int(state.round)}, not {step}")
        why = check(state) if check is not None else None
        if why is not None:
          raise ValueError(f"its state diverged: {why}")
      except Exception as e:  # noqa: BLE001 (any failure means: this checkpoint is unusable)
        path = os.path.join(self.directory, str(step))
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        bad.append(f"{path} ({reason})")
        warn(f"warning: checkpoint {path} does not restore ({reason}); trying an older one")
        continue
      for b in steps[: steps.index(step)]:
        self._delete(b)
      return state
    raise CheckpointError(
      f"no checkpoint in {self.directory} restores: {'; '.join(bad)}. Delete that folder (or "
      "run with --overwrite) to start the run fresh"
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
