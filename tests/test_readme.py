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


def test_the_quickstart_prints_its_table_then_its_files_on_stdout(tmp_path, capsys):
  """Issue 57 item 21: the README says the quickstart prints the final table, then every file it
  wrote; both are on stdout (the listing went to stderr), progress and messages on stderr."""
  from helpers import hierfavg_config

  from fedtree import experiment

  experiment.train_and_evaluate(hierfavg_config(rounds=2), str(tmp_path))
  out, err = capsys.readouterr()
  readme = " ".join(open(os.path.join(ROOT, "README.md")).read().split())
  assert "the final table, then every file it wrote, with full paths (both on stdout" in readme
  table, listing = out.index("Final evaluation"), out.index(f"fedtree: the workdir {tmp_path} holds:")
  assert table < listing and f"  {tmp_path / 'summary.json'}" in out[listing:]
  assert "holds:" not in err and f"fedtree: workdir {tmp_path}" in err
