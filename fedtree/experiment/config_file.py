"""Config files (``configs/<name>.py``) loaded by path, as ``--config=`` loads them.

Example:
  From a script run at the repository root (``configs`` is a folder, not an installed
  package, so ``from configs.quickstart import get_config`` works only where the repository
  root is on ``sys.path``):

  >>> config = load_config("configs/quickstart.py")
  >>> config.rounds > 0
  True
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections


def load_config(path: str) -> ml_collections.ConfigDict:
  """``get_config()`` of the config file ``path``; ``path:arg`` passes ``arg`` (a variant, e.g.
  ``configs/fedkws.py:seeds``), as ``python -m fedtree.main --config=path:arg`` does. A relative
  path is taken from the current directory.

  Raises:
    ValueError: no such file, or a file without ``get_config``.
  """
  file, _, arg = path.partition(":")
  if not os.path.isfile(file):
    raise ValueError(f"config file {file!r} not found (from {os.getcwd()}); give its path, e.g. "
                     "configs/quickstart.py from the repository root")
  name = os.path.splitext(os.path.basename(file))[0]
  spec = importlib.util.spec_from_file_location(f"fedtree_config_{name}", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {file!r} has no get_config()")
  return module.get_config(arg) if arg else module.get_config()
