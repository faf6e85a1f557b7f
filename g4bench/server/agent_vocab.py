"""One server's view of its vocabulary for the agent protocol: the grammar vocabulary (built once,
on first use) and the bytes each id writes into the text the output parser reads.

    SyntheticTokenizer -> grammar.piece_vocab(pieces)   (ids 0-2 special, every other id its piece)
    HFTokenizer        -> grammar.hf_vocab(tokenizer.json) (markers as single special tokens)

`Tokenizer.decode` of a real checkpoint drops special tokens, among them ``<|tool_call>`` and
``<channel|>``, which the parser needs; requests that use tools therefore detokenize through
`piece` (agent_output.pieces_from_vocab) instead. The synthetic tokenizer's decode already keeps
every piece, so it is its own `piece`. Building a 262,144-id vocabulary takes a moment, so it is
done lazily (in a request worker thread, under a lock), never for servers that see no constraint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from g4bench.engine.grammar import GrammarVocab, hf_vocab, piece_vocab
from g4bench.server.agent_output import pieces_from_vocab
from g4bench.server.synthetic_tokenizer import BOS_ID, EOS_ID, PAD_ID, SyntheticTokenizer
from g4bench.server.tokenizer import HFTokenizer, Tokenizer


class AgentVocabError(ValueError):
    """This tokenizer has no grammar vocabulary (a test double): constraints cannot be served."""


class AgentVocab:
    """The grammar vocabulary and id -> bytes of one server's tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, eos_ids
        self._lock = threading.Lock()
        self._grammar: GrammarVocab | None = None
        self._piece: Callable[[int], bytes] | None = None

    @property
    def synthetic(self) -> bool:
        return isinstance(self.tokenizer, SyntheticTokenizer)

    def grammar(self) -> GrammarVocab:
        with self._lock:
            if self._grammar is None:
                self._grammar = self._build()
            return self._grammar

    def _build(self) -> GrammarVocab:
        tok = self.tokenizer
        if isinstance(tok, SyntheticTokenizer):
            pieces = [tok.piece(i).encode() for i in range(self.vocab_size)]
            return piece_vocab(pieces, EOS_ID, BOS_ID, [PAD_ID, EOS_ID, BOS_ID])
        if isinstance(tok, HFTokenizer):
            return hf_vocab(str(tok.path), sorted(self.eos_ids), self.vocab_size)
        raise AgentVocabError(f"{type(tok).__name__} has no grammar vocabulary")

    def piece(self, token: int) -> bytes:
        """The bytes id `token` writes, markers included (special ids other than markers: none)."""
        if isinstance(self.tokenizer, SyntheticTokenizer):
            return self.tokenizer.piece(token).encode()
        if self._piece is None:
            self._piece = pieces_from_vocab(self.grammar())
        return self._piece(token)
