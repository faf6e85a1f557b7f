"""The tokenizer of synthetic models: every id decodes to a short, non-empty piece of text.

A synthetic model (random weights) samples ids from its whole vocabulary. For what a client sees to
look like a real model's stream (one token → one visible delta, which is what `vllm bench serve`,
GuideLLM and AIPerf time TTFT and ITL by), every id the model can emit must decode to text:

    0, 1, 2               <pad>, <eos>, <bos>: special, decode to "" (as with skip_special_tokens)
    3 .. 130              the 128 ASCII characters, id = ord(c) + 3
    131                   "⁇", the unknown-character piece (SentencePiece's spelling)
    132 .. 132+len(EXTRA) EXTRA: Latin-1 letters and common typographic characters, one id each
    after that            pseudo-syllables ("ka", " ka", "kaster", " rotin", …), 1-7 characters

`encode` maps text character by character (ASCII and EXTRA to their ids, anything else to "⁇"), so N
ASCII characters are exactly N tokens (serve-load's chat transport counts on that) and
`max_token_chars` is 1. Syllable pieces only come out of the model; re-encoding their text gives
different (per-character) ids, as re-tokenizing a real model's output sometimes does.
Decoding is arithmetic on the id (no table), so a 262,144-entry vocabulary costs nothing to build.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
ASCII_OFFSET = 3  # id of chr(0)
UNK_ID = ASCII_OFFSET + 128
UNK_PIECE = "\u2047"  # ⁇
EXTRA = (
    "".join(chr(c) for c in range(0xA1, 0x100) if c != 0xAD)  # Latin-1 letters and signs, no soft hyphen
    + "\u2013\u2014\u2018\u2019\u201c\u201d\u2026\u2022\u20ac\u2122\u2192\u2190\u2264\u2265\u00a0"
)
FIRST_SYLLABLE_ID = UNK_ID + 1 + len(EXTRA)
_SYLLABLES = tuple(o + v + c for o in "bcdfghjklmnprstvwz" for v in "aeiou" for c in ("", "n", "r", "s", "t"))
_S = len(_SYLLABLES)
MAX_VOCAB = FIRST_SYLLABLE_ID + 2 * (_S + _S * _S)


class SyntheticTokenizer:
    """See the module docstring for the id layout."""

    bos_token_id: int | None = BOS_ID
    eos_token_id: int | None = EOS_ID
    pad_token_id: int | None = PAD_ID
    max_token_chars = 1

    def __init__(self, vocab_size: int = FIRST_SYLLABLE_ID) -> None:
        if not UNK_ID < vocab_size <= MAX_VOCAB:
            raise ValueError(
                f"the synthetic tokenizer needs {UNK_ID + 1} <= vocab_size <= {MAX_VOCAB}, got {vocab_size}"
            )
        self.vocab_size = vocab_size
        singles = [chr(c) for c in range(128)] + [UNK_PIECE] + list(EXTRA)
        self._char_ids = {
            ch: ASCII_OFFSET + i for i, ch in enumerate(singles) if ASCII_OFFSET + i < vocab_size
        }
        del self._char_ids[UNK_PIECE]  # "⁇" in text is an unknown character like any other

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        get = self._char_ids.get
        ids = [get(ch, UNK_ID) for ch in text]
        return [BOS_ID, *ids] if add_bos else ids

    def piece(self, i: int) -> str:
        """The text of id `i` ("" for the special ids and ids outside the vocabulary)."""
        if not ASCII_OFFSET <= i < self.vocab_size:
            return ""
        if i < UNK_ID:
            return chr(i - ASCII_OFFSET)
        if i == UNK_ID:
            return UNK_PIECE
        if i < FIRST_SYLLABLE_ID:
            return EXTRA[i - UNK_ID - 1]
        k, lead = divmod(i - FIRST_SYLLABLE_ID, 2)
        space = " " if lead == 0 else ""
        if k < _S:
            return space + _SYLLABLES[k]
        k -= _S
        return space + _SYLLABLES[k // _S] + _SYLLABLES[k % _S]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.piece(int(i)) for i in ids)

    def token_id(self, token: str) -> int | None:
        return {"<pad>": PAD_ID, "<eos>": EOS_ID, "<bos>": BOS_ID}.get(token)
