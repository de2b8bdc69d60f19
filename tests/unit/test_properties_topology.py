"""Topology and manifest loading: any file gives a model or a ConfigurationError whose
every line names the file (and, for a field, where in it), never another exception.

Fed arbitrary bytes, arbitrary YAML documents, and the shipped files with one value
replaced by anything (or by a raw hostile YAML token: 5,000-digit numbers, deep
nesting, aliases of aliases, unknown tags), or one key removed or added.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.loading import load_topology
from shared.contracts.manifests import ManifestSet, load_manifest_set
from shared.contracts.topology import MAX_YAML_DEPTH, MAX_YAML_VALUES, Topology
from shared.domain.errors import ConfigurationError
from tests.unit.hostile_values import hostile_json, hostile_text

PROPERTY = settings(max_examples=200, deadline=None)
ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = yaml.safe_load((ROOT / "topologies/sea-vibespro.yaml").read_text())
MANIFEST = yaml.safe_load((ROOT / "manifests/sea-vibespro/sea.yaml").read_text())
MARKER = "HOSTILE-MARKER"

yaml_tokens = st.sampled_from(
    [
        "9" * 5000,
        "-" + "1" * 4400,
        "0x" + "f" * 5000,
        "1.0e999",
        ".nan",
        "-.inf",
        "2025-01-01",
        "2025-01-01T00:00:00Z",
        "~",
        "*nowhere",
        "!!python/object:os.system",
        "!!binary AAAA",
        "[" * 300 + "]" * 300,
        "{a: " * 150 + "1" + "}" * 150,
        "&a [*a]",
        '"\\ud800"',
        '"\\0"',
        "? [a]\n: 1",
        "|\n  text",
    ]
)
#: Aliases of aliases: nine lists each holding the previous one nine times.
ALIAS_BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    + [f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 9) + "]" for n in range(1, 9)]
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile_files")


def _load_topology(work: Path, data: bytes) -> Topology | ConfigurationError:
    path = work / "topology.yaml"
    path.write_bytes(data)
    try:
        return load_topology(path, with_events=False)
    except ConfigurationError as exc:
        _assert_names_the_file(exc, str(path))
        return exc


def _load_manifest(work: Path, data: bytes) -> ManifestSet | ConfigurationError:
    directory = work / "manifests"
    directory.mkdir(exist_ok=True)
    (directory / "sea.yaml").write_bytes(data)
    try:
        return load_manifest_set(directory, label_root=work)
    except ConfigurationError as exc:
        _assert_names_the_file(exc, "manifests/sea.yaml")
        return exc


def _assert_names_the_file(exc: ConfigurationError, label: str) -> None:
    lines = str(exc).splitlines()
    assert lines and lines[0].startswith(f"{label}: ")
    assert len(str(exc)) < 20_000


# --- what crashed before ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"name: \xff\xfe\n", "not UTF-8"),
        (b"a: " + b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (b"name: x\nmax: " + b"9" * 5000, "not valid YAML"),
        (b"context: sea\nhandles: [{producer: 0x" + b"f" * 5000 + b"}]", "over 4,000 digits"),
        (b"a: " + b"[" * (MAX_YAML_DEPTH + 5) + b"]" * (MAX_YAML_DEPTH + 5), "nested deeper"),
        (ALIAS_BOMB.encode(), f"more than {MAX_YAML_VALUES} values"),
    ],
)
def test_files_that_crashed_the_loaders_are_configuration_errors(
    work: Path, data: bytes, says: str
) -> None:
    for loaded in (_load_topology(work, data), _load_manifest(work, data)):
        assert isinstance(loaded, ConfigurationError) and says in str(loaded)


def test_the_shipped_files_still_load(work: Path) -> None:
    assert isinstance(_load_topology(work, yaml.safe_dump(TOPOLOGY).encode()), Topology)
    assert isinstance(_load_manifest(work, yaml.safe_dump(MANIFEST).encode()), ManifestSet)


# --- properties ------------------------------------------------------------------------


@PROPERTY
@given(
    data=st.one_of(
        st.binary(max_size=300),
        hostile_text.map(lambda text: text.encode("utf-8", "surrogatepass")),
    )
)
def test_any_bytes_load_or_are_a_configuration_error(work: Path, data: bytes) -> None:
    _load_topology(work, data)
    _load_manifest(work, data)


@PROPERTY
@given(doc=hostile_json)
def test_any_yaml_document_loads_or_is_a_configuration_error(work: Path, doc: Any) -> None:
    data = yaml.safe_dump(doc, allow_unicode=False).encode()
    _load_topology(work, data)
    _load_manifest(work, data)


@st.composite
def _mutated(draw: st.DrawFn, original: dict[str, Any]) -> bytes:
    """``original`` with one value replaced, one key removed or one key added."""
    doc = copy.deepcopy(original)
    node: Any = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        child = node[key]
        if not isinstance(child, dict | list) or draw(st.booleans()):
            break
        node = child
    if not keys:
        return yaml.safe_dump(doc).encode()
    action = draw(st.sampled_from(["replace", "raw", "remove", "add"]))
    if action == "remove":
        del node[key]
    elif action == "add" and isinstance(node, dict):
        node[draw(hostile_text)] = draw(hostile_json)
    elif action == "raw":
        node[key] = MARKER
        return yaml.safe_dump(doc).replace(MARKER, draw(yaml_tokens)).encode()
    else:
        node[key] = draw(hostile_json)
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans())).encode()


@PROPERTY
@given(data=_mutated(TOPOLOGY))
def test_a_mutated_topology_loads_or_names_the_file(work: Path, data: bytes) -> None:
    _load_topology(work, data)


@PROPERTY
@given(data=_mutated(MANIFEST))
def test_a_mutated_manifest_loads_or_names_the_file(work: Path, data: bytes) -> None:
    _load_manifest(work, data)
