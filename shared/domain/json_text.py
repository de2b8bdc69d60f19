"""JSON as Ferry writes and reads it: compact UTF-8 on the wire, canonical for digests,
strict (RFC 8259, valid Unicode, bounded nesting) when it comes in.

Reading never raises anything but :class:`PoisonError` (``MALFORMED_JSON``) naming the
defect; :func:`json_defect` names what makes a decoded document unfit to travel.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from shared.domain.errors import PoisonError

#: Deepest payload accepted: objects and arrays nested at most this many levels. The
#: producer refuses a deeper one; on the wire an envelope nesting deeper is poison
#: (unbounded nesting ends in a ``RecursionError`` somewhere down the line).
MAX_PAYLOAD_DEPTH = 64
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


#: ``json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str)``, built once.
_WIRE_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def wire_json(doc: Any) -> bytes:
    """``doc`` as compact UTF-8 JSON, the form every body Ferry sends takes (sizes are wire
    sizes: a Cyrillic letter is 2 bytes, not a 6-byte ``\\u`` escape). ASCII escapes only
    when the text holds what UTF-8 cannot carry (a lone surrogate), so nothing is refused.
    Values JSON has no form for are written as their ``str``."""
    try:
        return _WIRE_ENCODER.encode(doc).encode()
    except UnicodeEncodeError:
        return json.dumps(doc, separators=(",", ":"), default=str).encode()


#: ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, built
#: once (``json.dumps`` builds an encoder per call when given options).
_CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """Serialise ``value`` so equal documents give equal strings (sorted keys, no spaces).

    UTF-8 text, not ASCII escapes: the payload digest has always been taken over these
    characters encoded as UTF-8 (so digests of stored rows and records stay as they are).
    """
    return _CANONICAL_ENCODER.encode(value)


def payload_digest(payload: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``payload`` (INFRA-005 payloadDigest)."""
    return "sha256:" + hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def json_defect(
    value: Any,
    *,
    where: str = "payload",
    max_depth: int = MAX_PAYLOAD_DEPTH,
    forbid_nul: bool = False,
    check_text: bool = True,
) -> str | None:
    """What makes decoded JSON ``value`` unfit to travel as UTF-8 JSON, or ``None``.

    Nesting deeper than ``max_depth`` (``value`` itself is level 1), a string (key or
    value) with a lone surrogate, which no UTF-8 encoder can write, and with
    ``forbid_nul`` a NUL character, which PostgreSQL (``jsonb``, ``text``) cannot store
    (``check_text=False`` checks the nesting only). Walked without recursion, so any
    depth is measured safely; the answer names the first offending path.
    """
    if isinstance(value, dict | list) and _surely_sound(value, max_depth, forbid_nul, check_text):
        return None
    return _walked_defect(value, where, max_depth, forbid_nul, check_text)


def _walked_defect(
    value: Any, where: str, max_depth: int, forbid_nul: bool, check_text: bool
) -> str | None:
    """:func:`json_defect` by walking ``value``, without the shortcut through its text."""
    if not check_text and isinstance(value, dict | list) and _nests_within(value, max_depth):
        return None  # nesting is all there is to check, and it is within bounds
    return _walk(value, where, max_depth, forbid_nul, check_text)


def _walk(value: Any, where: str, max_depth: int, forbid_nul: bool, check_text: bool) -> str | None:
    """The walk itself: every node, its path kept to name the first defect."""
    # Paths are kept as (parent, step) links and spelled out only for the answer.
    stack: list[tuple[Any, Any, int]] = [(value, None, 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            problem = _text_defect(node, forbid_nul)
            if problem:
                return f"{_spell(where, path)}: {problem}"
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > max_depth:
            return f"{_spell(where, path)}: nested deeper than {max_depth} levels"
        items = enumerate(node) if isinstance(node, list) else node.items()
        for step, item in items:
            problem = _text_defect(step, forbid_nul) if check_text else ""
            if problem:
                return f"{_spell(where, path)}: key {shown(step)}: {problem}"
            if isinstance(item, dict | list) or (check_text and isinstance(item, str)):
                stack.append((item, (path, step), depth + 1))
    return None


_CONTAINERS = (dict, list)


def _nests_within(value: dict[Any, Any] | list[Any], max_depth: int) -> bool:
    """True if the containers in ``value`` (itself level 1) nest at most ``max_depth``
    levels: a walk level by level that keeps no paths (the walk below names the place
    when there is one to name)."""
    level: list[Any] = [value]
    for _ in range(max_depth):
        below: list[Any] = []
        for node in level:
            items = node.values() if isinstance(node, dict) else node
            below += [item for item in items if isinstance(item, _CONTAINERS)]
        if not below:
            return True
        level = below
    return False


#: Strict JSON text of a document: no ``default`` (anything JSON has no form for raises).
_PLAIN_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _surely_sound(value: Any, max_depth: int, forbid_nul: bool, check_text: bool) -> bool:
    """True only if :func:`json_defect` of the object or array ``value`` is None, judged on
    its JSON text (C speed) instead of a walk: every container opens one bracket, so no
    more brackets than levels cannot nest too deep; the text keeps every string, key or
    value, as it is (a lone surrogate too) except control characters, which it escapes
    (NUL as ``\\u0000``). False means "walk it" (also for anything the encoder refuses)."""
    try:
        text = _PLAIN_ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError):
        return False
    if text.count("[") + text.count("{") > max_depth:
        return False
    if not check_text:
        return True
    if forbid_nul and "\\u0000" in text:
        return False
    return text.isascii() or _LONE_SURROGATE.search(text) is None


def _spell(where: str, path: Any) -> str:
    steps: list[str] = []
    while path is not None:
        path, step = path
        steps.append(f"[{step}]" if isinstance(step, int) else f".{shorten(step)}")
    return where + "".join(reversed(steps))


def _text_defect(text: object, forbid_nul: bool) -> str:
    if not isinstance(text, str):
        return ""  # a list index
    if forbid_nul and "\x00" in text:
        return "text contains NUL (U+0000), which PostgreSQL cannot store"
    if not text.isascii() and _LONE_SURROGATE.search(text):
        return "text is not valid Unicode (a lone surrogate)"
    return ""


def shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: object) -> str:
    """A peer's value for an error message: repr (escapes NULs and surrogates), truncated."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    # 1e400 is valid JSON but no double: Python would read it as inf and write it on as
    # "Infinity", which is not JSON at all.
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {shorten(text)} is out of range for a double")
    return value


#: ``json.loads``'s decoder with the strict number rules, built once.
_STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def parse_json_body(data: bytes, *, max_depth: int = MAX_PAYLOAD_DEPTH + 1) -> Any:
    """``data`` as strict JSON: UTF-8, RFC 8259, nested at most ``max_depth`` levels (by
    default one deeper than a payload may be: an envelope's), text that is valid Unicode;
    else :class:`PoisonError` (``MALFORMED_JSON``) naming the defect."""
    try:
        data = bytes(data)
        text = data.decode("utf-8")
        # ValueError also covers integers over Python's 4,300-digit limit.
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        doc = _STRICT_DECODER.decode(text)
    except (ValueError, TypeError) as exc:
        raise PoisonError("MALFORMED_JSON", f"body is not JSON: {shorten(str(exc), 200)}") from None
    except RecursionError:
        raise PoisonError("MALFORMED_JSON", f"body nests deeper than {max_depth} levels") from None
    # Cheap tests first: UTF-8 cannot carry a surrogate, only a \\uD8xx escape can; and
    # fewer brackets than levels cannot nest too deep. Most bodies need no walk at all.
    # Past the bracket test, straight to the walk: the shortcut through the document's
    # text (:func:`_surely_sound`) would encode it again only to find as many brackets.
    escaped = b"\\ud" in data or b"\\uD" in data
    deep = data.count(b"[") + data.count(b"{") > max_depth
    if deep or escaped:
        if deep:
            defect = _walked_defect(doc, "body", max_depth, False, escaped)
        else:
            defect = json_defect(doc, where="body", max_depth=max_depth, check_text=True)
        if defect is not None:
            raise PoisonError("MALFORMED_JSON", defect)
    return doc
