"""The text cleaning every item goes through (``_text_cleaning.clean_text``), its
streaming form (``TextJoiner``) and its form for JSON-like values (``clean_value``):
unit tests of a private module's contract."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from trio_agents._text_cleaning import TextJoiner, clean_text, clean_value

# Any code point, surrogates included (Hypothesis leaves them out by default).
_ANY = st.characters(codec=None, categories=None)
_TEXT = st.text(_ANY, max_size=20)
_PIECES = st.sampled_from(["a", "é", "\ud83d", "\ude00", "\udce9", "\x00", "😀"])
_CHUNK = st.one_of(_TEXT, st.lists(_PIECES, max_size=6).map("".join))


def test_examples() -> None:
    assert clean_text("r\udce9sum\udce9.pdf") == "r\ufffdsum\ufffd.pdf"
    assert clean_text("\ud83d\ude00") == "\U0001f600"  # a pair, as two code points
    assert clean_text("\ude00\ud83d") == "\ufffd\ufffd"  # halves the wrong way round
    assert clean_text("\ud83dx") == "\ufffdx"
    assert clean_text("a\x00b") == "a\x00b"  # NUL is text
    plain = "héllo 😀"
    assert clean_text(plain) is plain


@given(_CHUNK)
def test_clean_text_always_encodes_and_keeps_what_encodes(text: str) -> None:
    cleaned = clean_text(text)
    cleaned.encode("utf-8")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert cleaned != text
    else:
        assert cleaned == text
    assert clean_text(cleaned) == cleaned


@given(st.lists(_CHUNK, max_size=6))
def test_the_joiner_gives_out_what_cleaning_the_whole_gives(chunks: list[str]) -> None:
    joiner = TextJoiner()
    out = [joiner.feed(chunk) for chunk in chunks]
    out.append(joiner.flush())
    for piece in out:
        piece.encode("utf-8")
    assert "".join(out) == clean_text("".join(chunks))


def test_the_joiner_joins_a_pair_split_across_deltas() -> None:
    joiner = TextJoiner()
    assert joiner.feed("smile \ud83d") == "smile "
    assert joiner.feed("\ude00!") == "\U0001f600!"
    assert joiner.feed("\ud83d") == ""
    assert joiner.flush() == "\ufffd"
    assert joiner.flush() == ""


_JSONISH = st.recursive(
    st.none() | st.integers() | _TEXT,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(_TEXT, inner, max_size=3)
    ),
    max_leaves=12,
)


def test_clean_value_examples() -> None:
    value = {"k\ud800": ["v\udc00", ("\ud83d\ude00", 3)], 1: None, "ok": {"deep": "\udfff"}}
    assert clean_value(value) == {
        "k\ufffd": ["v\ufffd", ("\U0001f600", 3)],
        1: None,
        "ok": {"deep": "\ufffd"},
    }
    marker = object()  # not JSON: left as it is
    assert clean_value([marker])[0] is marker


@given(_JSONISH)
def test_clean_value_leaves_no_surrogate_and_keeps_what_encodes(value: object) -> None:
    cleaned = clean_value(value)
    json.dumps(cleaned, ensure_ascii=False).encode("utf-8")  # no lone surrogate left
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return
    assert cleaned == value  # nothing to repair: the same value
