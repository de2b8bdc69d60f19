"""Reading a YAML file into a mapping, bounded: whatever the file holds, the answer is the
mapping or a :class:`ConfigurationError` naming the file (topology and manifest files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shared.domain.errors import ConfigurationError

#: Most values a YAML file may expand to (aliases counted each time they are used): a
#: few aliased lists nested in one another otherwise expand past any memory.
MAX_YAML_VALUES = 100_000
#: Deepest nesting a YAML file may have (PyYAML composes recursively).
MAX_YAML_DEPTH = 100
#: Integers below 2**13000 (3,914 digits) print within Python's 4,300-digit limit.
_PRINTABLE_INT_BITS = 13_000


def load_yaml_mapping(path: Path, label: str, what: str) -> dict[str, Any]:
    """The YAML mapping in ``path``, or a :class:`ConfigurationError` starting ``label:``.

    Whatever the file holds (not UTF-8, not YAML, nested past ``MAX_YAML_DEPTH``, numbers
    past Python's 4,300-digit limit, an alias bomb), the answer is the mapping or that
    error, never another exception.
    """
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"{label}: cannot read {what}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"{label}: not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{label}: not valid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigurationError(f"{label}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    except ValueError as exc:  # the constructor's int(): a number of over 4,300 digits
        raise ConfigurationError(f"{label}: not valid YAML: {str(exc)[:120]}") from None
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{label}: the top level must be a mapping")
    _check_expanse(raw, label)
    return raw


def _check_expanse(raw: dict[str, Any], label: str) -> None:
    """Refuse a document nested too deep or expanding to too many values (iteratively)."""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    values = 0
    while stack:
        node, depth = stack.pop()
        values += 1
        if values > MAX_YAML_VALUES:
            raise ConfigurationError(
                f"{label}: expands to more than {MAX_YAML_VALUES} values (aliases of aliases?)"
            )
        if depth > MAX_YAML_DEPTH:
            raise ConfigurationError(f"{label}: nested deeper than {MAX_YAML_DEPTH} levels")
        if isinstance(node, int) and node.bit_length() > _PRINTABLE_INT_BITS:
            # e.g. 0xfff… (hex has no digit limit): no error message could even print it.
            raise ConfigurationError(f"{label}: a number of over 4,000 digits")
        if isinstance(node, dict):
            stack.extend((item, depth + 1) for pair in node.items() for item in pair)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
