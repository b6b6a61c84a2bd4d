"""MkDocs hook: ``<!-- include PATH -->`` in a page is replaced by the repository file PATH
(the benchmarks page shows ``benchmarks/README.md`` as it is, so the numbers live in one place).
Pictures the included file links relative to itself (``results/*.png``) are left out: the page
shows the copies under ``docs/images/``."""

import os
import re

INCLUDE = re.compile(r"<!-- include (\S+) -->")
PICTURE = re.compile(r"^!\[[^\]]*\]\((?!https?:)[^)]*\)\s*$", re.MULTILINE)


def on_page_markdown(markdown, page, config, files):
  root = os.path.dirname(config["config_file_path"])

  def include(match):
    with open(os.path.join(root, match.group(1)), encoding="utf-8") as f:
      text = f.read()
    return PICTURE.sub("", text.split("\n", 1)[1])  # the file's title is the page's

  return INCLUDE.sub(include, markdown)
