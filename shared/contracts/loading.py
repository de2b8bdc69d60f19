"""Load a topology file with its events: the file's models plus the generated registry.

Its own module because it needs both :mod:`.topology` (the file) and :mod:`.events` (the
registry, which imports :mod:`.topology`): here neither has to import the other late.
"""

from __future__ import annotations

from pathlib import Path

from shared.contracts.events import attach_events
from shared.contracts.topology import Topology, read_topology


def load_topology(path: Path | str, *, with_events: bool = True) -> Topology:
    """Read and validate a topology file; every error names the file and the field.

    Its events come from the generated registry (compiled from the manifests), keyed by
    the topology's name; ``with_events=False`` leaves them out (the registry build, which
    compiles them from the manifests themselves, uses that).
    """
    topology = read_topology(path)
    if not with_events:
        return topology
    return attach_events(topology, source=str(path))
