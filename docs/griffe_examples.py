"""A griffe extension for the API reference (loaded by ``mkdocs.yml``,
``plugins.mkdocstrings.handlers.python.options.extensions``).

* A docstring section headed ``Example:`` is read as ``Examples:``. Google style (and napoleon)
  accept both headings; griffe's Google parser knows only ``Examples:`` and reads ``Example:``
  as an admonition whose body is Markdown, where every ``>>>`` line becomes a nested
  blockquote and the line breaks are lost. As an examples section the doctest is shown as a
  code block.
* In the docstring of a config file (``configs/*.py``, shown by the algorithm pages' "Config
  and results" sections), a paragraph whose every line is indented (the launch commands, the
  tables of measured figures) becomes a code block: Markdown wants four spaces, the configs
  indent by two.
"""

import os
import re

import griffe

EXAMPLE_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def fence_indented_paragraphs(text: str) -> str:
  """``text`` with every paragraph whose lines all start with two spaces fenced as code
  (``bash`` for a command, ``text`` for anything else), dedented by two."""
  out = []
  for block in PARAGRAPH_BREAK.split(text):
    lines = block.split("\n")
    if lines and all(line.startswith("  ") for line in lines if line.strip()) and block.strip():
      lang = "bash" if lines[0].lstrip().startswith("python ") else "text"
      block = "\n".join([f"```{lang}"] + [line[2:] for line in lines] + ["```"])
    out.append(block)
  return "\n\n".join(out)


class ExampleSections(griffe.Extension):
  """Rewrites a docstring before it is parsed, as the module docstring says."""

  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    doc = obj.docstring
    if doc is None:
      return
    if "Example:" in doc.value:
      doc.value = EXAMPLE_HEADING.sub(r"\1Examples:", doc.value)
    path = obj.filepath if isinstance(obj, griffe.Module) else None
    if isinstance(path, os.PathLike | str) and os.path.basename(os.path.dirname(path)) == "configs":
      doc.value = fence_indented_paragraphs(doc.value)
