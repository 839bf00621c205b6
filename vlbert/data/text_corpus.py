"""Text-only corpus reader (BooksCorpus / Wikipedia as prepared for BERT): one passage a line."""

from __future__ import annotations

from collections.abc import Iterator

from .errors import DataFormatError, require_file, text_lines


def iter_passages(path) -> Iterator[str]:
    """Passages one by one, blank lines (document breaks) skipped; streams large corpora."""
    path = require_file(path, "text corpus")
    for _, line in text_lines(path):
        line = line.strip()
        if line:
            yield line


def read_corpus(path) -> list[str]:
    passages = list(iter_passages(path))
    if not passages:
        raise DataFormatError(path, "no passages: the corpus is empty")
    return passages
