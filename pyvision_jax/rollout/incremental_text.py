"""Incremental detokenization of a growing token sequence, to find stop strings as tokens arrive."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class IncrementalText:
    """Text of a growing token sequence, decoded incrementally (vLLM's detokenizer scheme).

    Only complete characters are appended: while the newest tokens decode to an incomplete
    UTF-8 sequence (a trailing U+FFFD), their text is held back until a later token
    completes it, so a stop string is found at the first token that completes it.
    """

    def __init__(self, tokenizer: Any, window: int = 6):
        self._tokenizer = tokenizer
        self._window = window
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def append(self, token_id: int) -> str:
        """Adds one token; returns the text it completed (possibly empty)."""
        self._ids.append(int(token_id))
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix) :]
        self._read_offset = len(self._ids)
        self._prefix_offset = max(self._prefix_offset, self._read_offset - self._window)
        self.text += delta
        return delta
