"""Shared wording of the synthetic world: articles, numbers, plurals, tokenisation."""

from __future__ import annotations

import re
from collections import Counter

from .world import SceneObject

NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def plural(shape: str) -> str:
    return shape + ("es" if shape.endswith(("s", "x")) else "s")


def counted(n: int, phrase: str) -> str:
    """'a red circle', 'two red circles'."""
    if n == 1:
        return article(phrase)
    *attrs, shape = phrase.split()
    return " ".join([NUMBER_WORDS[n], *attrs, plural(shape)])


def join_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return " , ".join(items[:-1]) + " and " + items[-1]


def grouped_phrases(objects: list[SceneObject], with_size: bool = True) -> list[str]:
    """Identical-looking objects are counted together: ['two small red circles', 'a blue star']."""
    counts = Counter(o.phrase(with_size=with_size) for o in objects)
    return [counted(n, p) for p, n in counts.items()]


_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())
