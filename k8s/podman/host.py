"""What a machine needs before ``./dev image`` and ``./dev kube``: podman, its settings, and
a base image made from Debian's packages where no registry is reachable.

Everything is idempotent and checked before it is done: the packages are installed when
``podman`` is missing (as root, from Debian's archive); ``/etc/containers/containers.conf``
is written only when absent; the base image is built only when podman has no image of
that name. Measured on the machines this project runs on (issue 46): ``crun`` fails on
their hybrid cgroup layout and ``runc`` works; the sandbox refuses rlimits above nofile
20000 and nproc 32768, and ``podman play kube`` has no per-call flag for either, hence
the file.

The base image is ``debootstrap --variant=minbase bookworm`` with Python 3.11 from
Debian (the Python the Dockerfile's stages run), imported with ``podman import``. It
trusts the machine's own extra certificate authorities
(``/usr/local/share/ca-certificates``), as a build behind a TLS-inspecting proxy must to
reach PyPI and Debian's mirror from inside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PACKAGES = ("podman", "buildah", "debootstrap", "runc")
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONTAINERS_CONF_TEXT = """\
# Written by Ferry (k8s/podman/host.py) because none was here. runc: crun cannot run on
# this machine's hybrid cgroup layout. The ulimits: the sandbox refuses higher ones, and
# podman's defaults ask for more.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
"""
BASE_IMAGE = "localhost/ferry-base:bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
LOCAL_CAS = Path("/usr/local/share/ca-certificates")


class HostError(RuntimeError):
    """The machine cannot run containers; the message says what is missing and why."""


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = subprocess.run(cmd, check=True, text=True, **kw)
    return proc


def ensure_packages() -> None:
    missing = [p for p in PACKAGES if not _has(p)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise HostError(
            f"missing {', '.join(missing)}: install Debian's packages {' '.join(PACKAGES)} "
            "(as root: apt-get install ...)"
        )
    say(f"installing {' '.join(PACKAGES)} (Debian's packages)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL)
    run(["apt-get", "install", "-y", "-qq", *PACKAGES], env=env, stdout=subprocess.DEVNULL)


def _has(tool: str) -> bool:
    return bool(shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin"))


def ensure_containers_conf() -> None:
    if CONTAINERS_CONF.exists():
        return
    say(f"writing {CONTAINERS_CONF} (runtime runc, ulimits the sandbox allows)")
    CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
    CONTAINERS_CONF.write_text(CONTAINERS_CONF_TEXT)


def image_exists(name: str) -> bool:
    return subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0


def ensure_base_image(*, rebuild: bool = False) -> float:
    """Build :data:`BASE_IMAGE` unless podman has it; returns the seconds it took."""
    if image_exists(BASE_IMAGE) and not rebuild:
        return 0.0
    started = time.monotonic()
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    with tempfile.TemporaryDirectory(prefix="ferry-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        say(f"base image {BASE_IMAGE}: debootstrap --variant=minbase bookworm (about a minute)")
        run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(rootfs),
                MIRROR,
            ],
            stdout=subprocess.DEVNULL,
        )
        cas = sorted(LOCAL_CAS.glob("*.crt")) if LOCAL_CAS.is_dir() else []
        for ca in cas:
            shutil.copy(ca, rootfs / "usr/local/share/ca-certificates" / ca.name)
        if cas:
            run(["chroot", str(rootfs), "update-ca-certificates"], stdout=subprocess.DEVNULL)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run(
            [
                "podman",
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                "ENV LANG=C.UTF-8",
                "--change",
                'CMD ["/bin/bash"]',
                "-",
                BASE_IMAGE,
            ],
            stdin=tar.stdout,
            stdout=subprocess.DEVNULL,
        )
        if tar.wait() != 0:
            raise HostError("tar of the debootstrap root failed")
    return time.monotonic() - started


def prepare() -> float:
    """Packages, containers.conf and the base image; seconds spent on the base image."""
    if sys.platform != "linux":
        raise HostError("podman containers need Linux")
    ensure_packages()
    ensure_containers_conf()
    return ensure_base_image()
