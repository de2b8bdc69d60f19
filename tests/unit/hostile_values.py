"""Hypothesis strategies for what a peer, a file or a caller may hand Ferry.

Shared by the ``test_properties_*`` files: text with NULs, lone surrogates and multi-byte
characters, JSON-like values with NaN, huge integers and deep nesting, and raw JSON
tokens that Python's own ``json`` turns into exceptions.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

#: Any code point, lone surrogates and NUL included (``st.characters()`` leaves out Cs).
any_char = st.one_of(
    st.characters(),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.sampled_from(["\x00", "Ж", "😀", "\n", "\\", '"', "\u2028", "\ufeff"]),
)
#: Text of every kind, short.
hostile_text = st.text(alphabet=any_char, max_size=30)
#: Text a caller may legitimately send: any Unicode scalar value (no lone surrogates, no NUL).
clean_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=30,
)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities included
    hostile_text,
)
#: JSON-like values with every hostile leaf (NaN, lone surrogates, NUL, big ints).
hostile_json = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(hostile_text, children, max_size=4),
    ),
    max_leaves=20,
)
_clean_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    clean_text,
)
#: Values that are valid JSON and storable by PostgreSQL as ``jsonb``.
clean_json = st.recursive(
    _clean_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(clean_text, children, max_size=4),
    ),
    max_leaves=20,
)


def nested(depth: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``depth`` alternating objects and arrays."""
    value = leaf
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


#: Raw JSON texts that are hard on a parser: deep nesting, numbers past Python's
#: int-from-text limit, NaN, escaped lone surrogates and NULs, overlong floats.
hostile_tokens = st.one_of(
    st.sampled_from(
        [
            "9" * 5000,
            "-" + "1" * 4301,
            "1e999",
            "-1e999",
            "NaN",
            "Infinity",
            "-Infinity",
            '"\\ud800"',
            '"\\udfff\\ud800"',
            '"\\u0000"',
            '"a\\u0000b"',
            '{"\\ud800": 1}',
            "0." + "0" * 5000 + "1",
            '"' + "Ж" * 1000 + '"',
            "true",
            "null",
            '""',
            "[]",
            "{}",
        ]
    ),
    st.integers(min_value=1, max_value=5000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=5000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(min_value=1, max_value=200).map(lambda n: json.dumps(nested(n))),
    hostile_json.map(lambda v: json.dumps(v, ensure_ascii=True)),
)
