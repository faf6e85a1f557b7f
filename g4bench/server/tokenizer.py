"""Text <-> token ids for the server, and incremental (streaming) detokenization.

Two tokenizers share one small interface (`Tokenizer`):

- `SyntheticTokenizer` (synthetic_tokenizer.py) for synthetic models: every non-special id decodes
  to a short non-empty piece of text, so each sampled token streams as one visible delta.
- `HFTokenizer` for real checkpoints: `tokenizers.Tokenizer.from_file(tokenizer.json)` plus the
  special tokens named in `tokenizer_config.json`. Gemma's tokenizer adds no BOS of its own
  (seed-engine-notes §5 item 10: without BOS the model echoes the prompt), so `encode(add_bos=True)`
  prepends it unless the post-processor already did.

`IncrementalDecoder` turns a stream of ids into text deltas that never split a character: it decodes
a short window of recent ids and only releases text once it no longer ends in U+FFFD (an incomplete
UTF-8 sequence or byte-fallback piece); `flush()` releases whatever is left when the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

REPLACEMENT = "\ufffd"
# Ids an incomplete character may span before its text is released anyway (a UTF-8 character is at
# most 4 bytes; more pending ids than this can never complete one, so holding them back only costs).
MAX_PENDING_IDS = 8


class Tokenizer(Protocol):
    """What the server needs from a tokenizer."""

    vocab_size: int
    max_token_chars: int  # most characters one id of `encode` can cover (prompt checks before encoding)
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` with special tokens skipped."""
        ...

    def token_id(self, token: str) -> int | None:
        """Id of a (special) token spelled `token`, or None when the vocabulary has no such token."""
        ...


class Decoder(Protocol):
    """What `IncrementalDecoder` needs: ids -> text."""

    def decode(self, ids: Sequence[int]) -> str: ...


class PieceDecoder:
    """Ids -> text through `piece(id) -> bytes` (markers kept: agent_vocab.AgentVocab.piece)."""

    def __init__(self, piece) -> None:
        self._piece = piece

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self._piece(int(i)) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A checkpoint's `tokenizer.json` (via `tokenizers`) with its special tokens and chat template.

    `tokenizer_dir` holds tokenizer.json and usually tokenizer_config.json (bos/eos/pad token names,
    `chat_template`) and/or chat_template.jinja.
    """

    def __init__(self, tokenizer_dir: str | Path) -> None:
        from tokenizers import Tokenizer as RawTokenizer

        d = Path(tokenizer_dir)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {d}")
        self._tok = RawTokenizer.from_file(str(path))
        self.path = path
        config_path = d / "tokenizer_config.json"
        self.config: dict = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token = _token_name(self.config.get("bos_token")) or "<bos>"
        self.eos_token = _token_name(self.config.get("eos_token")) or "<eos>"
        self.bos_token_id = self._tok.token_to_id(self.bos_token)
        self.eos_token_id = self._tok.token_to_id(self.eos_token)
        self.pad_token_id = self._tok.token_to_id(_token_name(self.config.get("pad_token")) or "<pad>")
        self.chat_template = self._find_chat_template(d)
        self.generation_eos_ids = _generation_eos_ids(d / "generation_config.json")
        # Whether the post-processor adds BOS by itself (Gemma's does not).
        probe = self._tok.encode("a", add_special_tokens=True).ids
        self._adds_bos = bool(probe) and probe[0] == self.bos_token_id
        # The longest vocabulary entry bounds the characters one id can cover (byte-fallback entries
        # such as "<0xE2>" overstate it, which only loosens the bound). A normalizer that deletes
        # characters could pack more; the exact token count is checked after encoding anyway.
        self.max_token_chars = max(
            (len(piece) for piece in self._tok.get_vocab(with_added_tokens=True)), default=1
        )

    def _find_chat_template(self, d: Path) -> str | None:
        jinja = d / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text()
        template = self.config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        return template if isinstance(template, str) else None

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        # `tokenizers` returns None for unknown tokens (never the unk id: seed-engine-notes §5 item 20).
        return self._tok.token_to_id(token)


def _generation_eos_ids(path: Path) -> list[int]:
    """generation_config.json's `eos_token_id` (an int or a list), which may name more turn ends."""
    if not path.is_file():
        return []
    value = json.loads(path.read_text()).get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int)]


def _token_name(value: object) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class IncrementalDecoder:
    """Ids in, complete-character text deltas out (the prefix/read-offset scheme of vLLM and TGI).

    `prefix_offset..read_offset` is the window already turned into text; decoding
    `prefix_offset..end` and subtracting that window's text gives the new text, which is held back
    while it ends in U+FFFD (an unfinished multi-byte character), at most `MAX_PENDING_IDS` ids.

    The window never grows past one released group plus the pending ids, so a push costs O(1)
    decodes of bounded length: ids that produce no text (special tokens, pieces the tokenizer
    skips) advance the window like ids that do, instead of piling up in it (which made a run of
    n such ids cost O(n²)).
    """

    def __init__(self, tokenizer: Decoder) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token: int) -> str:
        self._ids.append(token)
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset :])
        pending = len(self._ids) - self._read_offset
        if new_text.endswith(REPLACEMENT) and pending < MAX_PENDING_IDS:
            return ""  # an unfinished character: wait for its next byte
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Text not yet released (an unfinished character becomes U+FFFD)."""
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]


def load_tokenizer(tokenizer_dir: str | Path | None, vocab_size: int) -> Tokenizer:
    """The checkpoint's tokenizer, or the synthetic one for synthetic models (`tokenizer_dir=None`)."""
    if tokenizer_dir is None:
        from g4bench.server.synthetic_tokenizer import SyntheticTokenizer

        return SyntheticTokenizer(vocab_size)
    return HFTokenizer(tokenizer_dir)
