"""Where Ferry's own declarations live, found from this file and never from the working directory.

A role or ``ferry`` run from any directory finds Ferry's shipped topologies, manifests,
schema lock and registry file here. A team's own ones are named by settings
(``FERRY_TOPOLOGY``, ``FERRY_REGISTRY``) or by a command's options (``--manifests``,
``--topologies``, ``--out``); a relative path given that way is the caller's path.
"""

from __future__ import annotations

from pathlib import Path

#: The project root: ``topologies/``, ``manifests/`` and ``shared/`` live under it.
ROOT = Path(__file__).resolve().parents[2]
#: Directories and files under a root, relative to it.
TOPOLOGIES = "topologies"
MANIFESTS = "manifests"
LOCK = "manifests/schemas.lock"
#: The registry file Ferry ships (``ferry registry generate`` writes it from ``manifests/``):
#: the registry every role loads when ``FERRY_REGISTRY`` is unset.
REGISTRY = "shared/contracts/registry.json"
#: The lock's file name inside a manifests directory.
LOCK_NAME = "schemas.lock"

#: The shipped registry file, as an absolute path.
SHIPPED_REGISTRY = ROOT / REGISTRY
#: The topology a role loads when ``FERRY_TOPOLOGY`` is unset.
DEFAULT_TOPOLOGY = ROOT / TOPOLOGIES / "sea-vibespro.yaml"
