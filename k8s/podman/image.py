"""``./dev image``: Ferry's images built with podman from the repository's Dockerfile.

Three targets: ``runtime`` (``localhost/ferry:dev``: every role, the handlers, the
provisioning Job), ``dev-servers`` (``localhost/ferry-dev-servers:dev``: PostgreSQL and
nats-server for the podman overlay) and, with ``--kpi``, ``kpi``
(``localhost/ferry-kpi:dev``: Java 17 and Spark). ``PYTHON_IMAGE`` is the base: the
ordinary ``python:3.11-slim-bookworm`` for users with a registry (``--python-image``),
here the Debian base of :mod:`k8s.podman.host`. Layers are cached by podman: a second
build with unchanged sources takes seconds. Prints each image's size and build time.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from k8s.podman import host

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {
    "runtime": "localhost/ferry:dev",
    "dev-servers": "localhost/ferry-dev-servers:dev",
    "kpi": "localhost/ferry-kpi:dev",
}


@dataclass(frozen=True)
class Built:
    target: str
    image: str
    seconds: float
    size_mb: float


def image_size_mb(image: str) -> float:
    out = subprocess.run(
        ["podman", "image", "inspect", image], check=True, text=True, capture_output=True
    ).stdout
    return float(json.loads(out)[0]["Size"]) / 1e6


def build(
    targets: list[str], *, python_image: str | None = None, quiet: bool = False
) -> list[Built]:
    base_seconds = 0.0
    if python_image is None:
        base_seconds = host.prepare()
        python_image = host.BASE_IMAGE
    else:
        host.ensure_packages()
        host.ensure_containers_conf()
    if base_seconds:
        host.say(f"base image built in {base_seconds:.0f} s")
    built = []
    for target in targets:
        image = TARGETS[target]
        host.say(f"podman build --target {target} -t {image}")
        started = time.monotonic()
        proc = subprocess.run(
            [
                "podman",
                "build",
                "--target",
                target,
                "--build-arg",
                f"PYTHON_IMAGE={python_image}",
                "-t",
                image,
                str(ROOT),
            ],
            text=True,
            capture_output=quiet,
            check=False,
        )
        if proc.returncode != 0:
            tail = (proc.stderr or "")[-3000:] if quiet else ""
            raise host.HostError(f"podman build --target {target} failed\n{tail}")
        seconds = time.monotonic() - started
        built.append(Built(target, image, seconds, image_size_mb(image)))
    print(f"{'image':34} {'size':>9} {'build':>8}")
    for b in built:
        print(f"{b.image:34} {b.size_mb:7.0f} MB {b.seconds:6.1f} s")
    return built
