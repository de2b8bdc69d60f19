"""``python -m shared.access.secret_copy SOURCE DEST``: a mounted secret as a file only we may read.

libpq and asyncpg ignore a password file (``?passfile=`` in a DSN) that its group or
others may read, and a Kubernetes Secret volume cannot provide one: with the pod's
``fsGroup`` the kubelet adds group read to every file of the volume, whatever
``defaultMode`` says. So each Ferry pod's init container copies its role's ``pgpass``
from the read-only Secret volume into a memory-backed ``emptyDir``, owned by the pod's
user and readable by it only (0600), and the role's DSN names that copy
(``k8s/generate.py``).

The content is never printed; errors name the files, never what is in them. Exit codes:
0 copied, 2 the source cannot be read or is empty, or the destination cannot be written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def copy_private(source: Path, dest: Path) -> None:
    """Copy ``source`` to ``dest`` byte for byte, 0600 from the first byte.

    OSError and ValueError name the file only.
    """
    data = source.read_bytes()
    if not data.strip():
        raise ValueError(f"{source} is empty")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m shared.access.secret_copy",
        description="Copy a mounted secret file to a file readable by its owner only (0600).",
    )
    parser.add_argument("source", type=Path, help="the secret file (e.g. a Secret volume's key)")
    parser.add_argument("dest", type=Path, help="where the private copy goes")
    args = parser.parse_args(argv)
    try:
        copy_private(args.source, args.dest)
    except OSError as exc:
        print(f"secret_copy: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"secret_copy: {exc}", file=sys.stderr)
        return 2
    print(f"secret_copy: {args.source} -> {args.dest} (0600)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
