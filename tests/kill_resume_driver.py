"""Runs ``train_and_evaluate`` on a config saved as JSON, killing itself with SIGKILL at a
chosen point (tests/test_resume.py's kill-and-resume tests).

  python tests/kill_resume_driver.py CONFIG.json WORKDIR [KILL_ROUND WHERE]

``WHERE``: ``after_log`` (right after the metrics row of ``KILL_ROUND`` is written, before
its checkpoint) or ``during_save`` (while the checkpoint of ``KILL_ROUND`` is being written).
"""

import json
import os
import signal
import sys

import ml_collections


def main(argv):
  config_path, workdir = argv[1], argv[2]
  kill_round = int(argv[3]) if len(argv) > 3 else -1
  where = argv[4] if len(argv) > 4 else "after_log"
  from fedtree.experiment import checkpoint, reporting, runner

  with open(config_path) as f:
    config = ml_collections.ConfigDict(json.load(f))

  def die():
    os.kill(os.getpid(), signal.SIGKILL)

  if where == "after_log":
    log = reporting.Reporter.log

    def killing_log(self, label, round_, metrics, **kw):
      log(self, label, round_, metrics, **kw)
      if int(round_) == kill_round:
        die()

    reporting.Reporter.log = killing_log
  elif where == "during_save":
    save = checkpoint.Checkpointer.maybe_save

    def killing_save(self, state, *, force=False):
      if int(state.round) == kill_round:
        self._manager.save(kill_round, args=self._ocp.args.StandardSave(state))  # async write
        die()
      return save(self, state, force=force)

    checkpoint.Checkpointer.maybe_save = killing_save
  else:
    raise ValueError(f"WHERE={where!r}; choose 'after_log' or 'during_save'")
  runner.train_and_evaluate(config, workdir)


if __name__ == "__main__":
  main(sys.argv)
