"""Load a topology file with its events: the file's models plus the registry's events.

Its own module because it needs both :mod:`.topology` (the file) and :mod:`.events` (the
registry, which imports :mod:`.topology`): here neither has to import the other late.
"""

from __future__ import annotations

from pathlib import Path

from shared.contracts.events import active_registry, attach_events, load_registry
from shared.contracts.registry_file import Registry
from shared.contracts.topology import Topology, read_topology


def load_topology(
    path: Path | str,
    *,
    with_events: bool = True,
    registry: Registry | Path | str | None = None,
) -> Topology:
    """Read and validate a topology file; every error names the file and the field.

    Its events come from ``registry`` (a registry or its file; default: the process's,
    ``FERRY_REGISTRY`` or the shipped one), keyed by the topology's name;
    ``with_events=False`` leaves them out (the registry build, which compiles them from
    the manifests themselves, uses that).
    """
    topology = read_topology(path)
    if not with_events:
        return topology
    if registry is None:
        loaded = active_registry()
    elif isinstance(registry, Registry):
        loaded = registry
    else:
        loaded = load_registry(registry)
    return attach_events(topology, source=str(path), registry=loaded)
