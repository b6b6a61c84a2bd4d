"""The README's tour runs as written (shortened) and its two commands stay in sync with CI."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_tour_runs():
  text = open(os.path.join(ROOT, "README.md")).read()
  code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
  code = code.replace("num_rounds=100", "num_rounds=10").replace("rounds_per_call=25", "rounds_per_call=5")
  exec(compile(code, "README.md", "exec"), {})


def test_readme_test_command_is_what_ci_runs():
  text = open(os.path.join(ROOT, "README.md")).read()
  blocks = re.findall(r"```bash\n(.*?)\n```", text, re.S)
  assert blocks[0].startswith("pip install -e . && python -m fedtree.main --config=configs/quickstart.py")
  ci = open(os.path.join(ROOT, ".ci", "run")).read()
  assert blocks[1].replace('pip install -e', 'pip install -q -e') in ci
