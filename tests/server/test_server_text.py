"""Tokenizers, incremental detokenization, stop strings and chat templates (no engine)."""

from __future__ import annotations

import json

import pytest

from g4bench.server.chat import ChatFormatter, TemplateError, render_synthetic_template
from g4bench.server.streaming import TextAssembler
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer
from g4bench.server.tokenizer import HFTokenizer, IncrementalDecoder, load_tokenizer


class Bytes:
    """A byte-fallback tokenizer in miniature: id b + 3 is byte b, ids 0-2 and >= 259 decode to
    nothing (special tokens). It has what the incremental decoder must cope with: characters that
    span several ids, and ids that produce no text. `calls` counts ids decoded (the work done)."""

    vocab_size, max_token_chars, bos_token_id, eos_token_id, pad_token_id = 512, 1, 2, 1, 0

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text, add_bos=False):
        return [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids):
        self.calls += len(ids)
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")

    def token_id(self, token):
        return None


def test_synthetic_tokenizer_every_id_is_visible_text():
    tok = SyntheticTokenizer(65536)
    pieces = [tok.decode([i]) for i in range(3, 65536)]
    assert all(pieces) and max(len(x) for x in pieces) <= 7  # non-empty, short
    assert tok.decode([0, 1, 2]) == ""  # special ids are skipped, as with skip_special_tokens
    ids = tok.encode("hé€ x", add_bos=True)
    assert ids[0] == 2 and ids[1] == ord("h") + 3 and len(ids) == 6  # one id per character
    assert tok.decode(ids) == "hé€ x" and tok.max_token_chars == 1
    assert tok.decode(tok.encode("a\U0001f600\ud800b")) == "a⁇⁇b"  # unknown -> ⁇, no error
    big = SyntheticTokenizer(262144)
    assert len({big.decode([i]) for i in range(3, 262144)}) == 262141  # every piece distinct
    with pytest.raises(ValueError):
        SyntheticTokenizer(100)
    # Every sampled id streams as exactly one visible delta.
    dec = IncrementalDecoder(tok)
    assert all(dec.push(i) == tok.decode([i]) for i in range(3, 4000, 7))


def test_incremental_decoder_never_splits_a_character():
    tok = Bytes()
    text = "a€b😀c"
    dec = IncrementalDecoder(tok)
    deltas = [dec.push(i) for i in tok.encode(text)]
    assert "".join(deltas) + dec.flush() == text
    assert all("\ufffd" not in d for d in deltas)
    # "€" is 3 bytes: nothing is released until its last byte arrives.
    assert deltas[1:4] == ["", "", "€"]
    # An unfinished character at the end comes out as U+FFFD on flush.
    dec = IncrementalDecoder(tok)
    assert dec.push(tok.encode("€")[0]) == ""
    assert dec.flush() == "\ufffd"


@pytest.mark.parametrize("silent", [300, 0x80 + 3])  # an id with no text; a lone continuation byte
def test_incremental_decoder_is_linear_in_silent_runs(silent):
    """8,192 ids that produce no text (or only U+FFFD) cost O(n) decoded ids, not O(n^2)."""
    tok = Bytes()
    dec = IncrementalDecoder(tok)
    n = 8192
    out = "".join(dec.push(silent) for _ in range(n)) + dec.push(ord("x") + 3) + dec.flush()
    assert out.endswith("x") and set(out[:-1]) <= {"\ufffd"}
    assert tok.calls < 40 * n  # quadratic would be about n^2 / 2 = 33.5 million


def test_text_assembler_stop_strings_hold_back_and_cut():
    tok = SyntheticTokenizer(512)
    asm = TextAssembler(tok, stop=["STOP"])
    out, stopped_at = [], None
    for n, i in enumerate(tok.encode("abcSTxSTOPtail"), start=1):
        delta, stopped = asm.push(i)
        out.append(delta)
        if stopped:
            stopped_at = n
            break
    assert "".join(out) == "abcSTx" and stopped_at == len("abcSTxSTOP")
    assert out[3:5] == ["", ""]  # "S", "T" held back while they could start "STOP"
    # Without a stop, held text is released at the end; min_tokens disarms early stops.
    asm = TextAssembler(tok, stop=["zz"], min_tokens=3)
    deltas = [asm.push(i)[0] for i in tok.encode("zzaz")]
    assert "".join(deltas) + asm.finish() == "zzaz" and not asm.stopped


def make_hf_dir(tmp_path, template: str | None = None, gen_eos=None):
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
    words = ["hello", "world", "user", "model", "system", "\n", "hi", "there"]
    vocab = {t: i for i, t in enumerate(specials + words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern=r"(<\|turn>|<turn\|>|<bos>|\n| )", behavior="isolated")
    tk.add_special_tokens(specials)
    tk.save(str(tmp_path / "tokenizer.json"))
    cfg = {"bos_token": "<bos>", "eos_token": {"content": "<eos>"}, "pad_token": "<pad>"}
    if template is not None:
        cfg["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    if gen_eos is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": gen_eos}))
    return tmp_path


GEMMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def test_hf_tokenizer_bos_and_special_ids(tmp_path):
    tok = HFTokenizer(make_hf_dir(tmp_path, GEMMA_LIKE, gen_eos=[1, 5]))
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (2, 1, 0)
    assert tok.encode("hello") == [6]  # no BOS unless asked
    assert tok.encode("hello", add_bos=True) == [2, 6]
    assert tok.encode("<bos>hello", add_bos=True) == [2, 6]  # not doubled
    assert tok.token_id("<turn|>") == 5 and tok.token_id("<end_of_turn>") is None
    assert tok.decode([2, 6, 5]) == "hello"
    assert isinstance(load_tokenizer(None, 512), SyntheticTokenizer)


def test_chat_formatter_renders_checkpoint_template(tmp_path):
    tok = HFTokenizer(make_hf_dir(tmp_path, GEMMA_LIKE, gen_eos=[1, 5]))
    fmt = ChatFormatter(tok)
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert fmt.render(msgs) == "<bos><|turn>user\nhello<turn|>\n<|turn>model\nhi<turn|>\n<|turn>model\n"
    ids = fmt.encode(msgs)
    assert ids[0] == 2 and ids.count(2) == 1  # the template's BOS, not a second one
    assert fmt.stop_token_ids == frozenset({0, 1, 5})  # pad, eos, <turn|>; never <unk> (3)
    assert fmt.stop_strings == []


def test_chat_template_without_bos_gets_one_and_sandbox_holds(tmp_path):
    tok = HFTokenizer(make_hf_dir(tmp_path, "{% for m in messages %}{{ m['content'] }}{% endfor %}"))
    assert ChatFormatter(tok).encode([{"role": "user", "content": "hello"}]) == [2, 6]
    evil = HFTokenizer(make_hf_dir(tmp_path, "{{ messages.__class__.__mro__[1].__subclasses__() }}"))
    with pytest.raises(TemplateError):
        ChatFormatter(evil).render([{"role": "user", "content": "x"}])
    raising = HFTokenizer(make_hf_dir(tmp_path, "{{ raise_exception('roles must alternate') }}"))
    with pytest.raises(TemplateError, match="roles must alternate"):
        ChatFormatter(raising).render([{"role": "user", "content": "x"}])


def test_synthetic_chat_template():
    fmt = ChatFormatter(SyntheticTokenizer(512))
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = "<|turn>system\nbe brief<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n"
    assert render_synthetic_template(msgs) == text
    assert fmt.encode(msgs) == [2] + SyntheticTokenizer(512).encode(text)
    assert fmt.stop_strings == ["<turn|>"] and fmt.stop_token_ids == frozenset({0, 1})
