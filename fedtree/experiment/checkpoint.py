"""Checkpoints of an algorithm's state with orbax, resumed automatically from the workdir.

A run's state is a pytree of arrays (models, optimizer states, per-client state, the round
counter); the round key is ``fold_in(key, state.round)``, so a resumed run continues exactly
where it stopped.
"""

from __future__ import annotations

import os
from typing import Any

import jax


class Checkpointer:
  """Saves ``state`` every ``every`` rounds under ``directory`` (keeping the last ``keep``)."""

  def __init__(self, directory: str, *, every: int, keep: int = 2):
    import orbax.checkpoint as ocp

    if every < 1:
      raise ValueError(f"checkpoint_every={every} must be >= 1 (0 disables checkpoints)")
    self._ocp = ocp
    self.every = int(every)
    self._manager = ocp.CheckpointManager(
      os.path.abspath(directory), options=ocp.CheckpointManagerOptions(max_to_keep=keep)
    )

  def latest_round(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, like: Any) -> Any:
    """The latest saved state, shaped like ``like`` (an initialized state)."""
    step = self._manager.latest_step()
    abstract = jax.tree.map(self._ocp.utils.to_shape_dtype_struct, like)
    return self._manager.restore(step, args=self._ocp.args.StandardRestore(abstract))

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
