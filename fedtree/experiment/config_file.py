"""Config files (``configs/<name>.py``) loaded by path, as ``--config=`` loads them, and the shipped
ones found from anywhere (:func:`shipped_config`).

Example:
  From a script run at the repository root (``configs`` is a folder, not an installed
  package, so ``from configs.quickstart import get_config`` works only where the repository
  root is on ``sys.path``):

  >>> config = load_config("configs/quickstart.py")
  >>> config.rounds > 0
  True

  From any folder (your own project's), a shipped config by name:

  >>> load_config(shipped_config("quickstart")).run_order == config.run_order
  True
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "configs")
"""The shipped config files: the repository's ``configs/`` beside the ``fedtree`` package (a clone,
installed with ``pip install -e .``)."""


def shipped_config(name: str) -> str:
  """The absolute path of the shipped config ``configs/<name>.py`` (``name:variant`` keeps the
  variant: ``shipped_config("fedkws:seeds")``), for :func:`load_config` or ``--config=`` from any
  folder.

  Raises:
    ValueError: no such shipped config (the shipped ones listed), or no ``configs/`` beside the
      package (an install that did not come from a clone).
  """
  file, sep, variant = name.partition(":")
  if not os.path.isdir(CONFIGS):
    raise ValueError(f"shipped_config({name!r}): no configs/ folder beside the fedtree package ({CONFIGS}); "
                     f"the shipped configs come with a clone of the repository (pip install -e .)")
  path = os.path.join(CONFIGS, *file.split("/")) + ("" if file.endswith(".py") else ".py")
  if not os.path.isfile(path):
    shipped = sorted(os.path.splitext(p)[0] for p in os.listdir(CONFIGS) if p.endswith(".py") and p[0] != "_")
    raise ValueError(f"shipped_config({name!r}): no configs/{file}.py; choose one of {shipped}")
  return path + sep + variant


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
                     "configs/quickstart.py from the repository root, or shipped_config('quickstart') "
                     "from any folder")
  name = os.path.splitext(os.path.basename(file))[0]
  spec = importlib.util.spec_from_file_location(f"fedtree_config_{name}", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {file!r} has no get_config()")
  return module.get_config(arg) if arg else module.get_config()
