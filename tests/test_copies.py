"""Code under `# Copied from transformers.<path> [with a->b]` is that code, as transformers' own
`utils/check_copies.py` keeps its copies: when transformers changes it, this fails and the copy is
looked at again (or its comment says "Adapted from" and why it differs)."""

import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "vlbert"
COPIED = re.compile(r"^(\s*)# Copied from (transformers\.[\w.]+)(?: with (.+))?$")


def _copies():
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            match = COPIED.match(line)
            if match:
                yield pytest.param(path, number, match, id=f"{path.relative_to(PACKAGE)}:{number + 1}")


def _block(lines: list[str], start: int) -> str:
    """The definition that starts at `start` and every line indented under it."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    return textwrap.dedent("\n".join(lines[start:end])).rstrip()


def _target(dotted: str):
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def test_there_are_copies_to_check():
    # The pre-training head's output embeddings (heads.py), written once for every family.
    assert len(list(_copies())) >= 2


@pytest.mark.parametrize(("path", "number", "match"), list(_copies()))
def test_a_copy_is_the_code_it_names(path, number, match):
    lines = path.read_text().splitlines()
    ours = _block(lines, number + 1)
    theirs = textwrap.dedent(inspect.getsource(_target(match.group(2)))).rstrip()
    for rename in (match.group(3) or "").split(","):
        if rename.strip():
            old, new = (part.strip() for part in rename.split("->"))
            theirs = re.sub(rf"\b{re.escape(old)}\b", new, theirs)
    assert ours == theirs, f"{path.name}:{number + 1} no longer copies {match.group(2)}"
