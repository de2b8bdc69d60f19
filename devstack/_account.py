"""The unprivileged account PostgreSQL runs as when the launcher itself runs as root.

PostgreSQL refuses to start as root, and dev containers/CI machines often run
everything as root. In that case we run ``initdb``/``postgres`` as a dedicated system
user, which must own the data directory and be able to reach the binaries and the
data directory through every parent directory.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

from devstack._proc import RunAs, ServerError

# Permission bits in the "other" position; shifted by 6 (owner) or 3 (group) when checked.
READ = 0o4
SEARCH = 0o1

_USERADD_NAME_IN_USE = 9  # useradd's documented exit status for "username already in use"


def ensure_system_user(name: str) -> RunAs:
    """Return the system account ``name``, creating it (idempotently) if it does not exist."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        _useradd(name)
        entry = pwd.getpwnam(name)
    return RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def _useradd(name: str) -> None:
    """Create a no-login system user with its own group."""
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    argv = [useradd, "--system", "--user-group", "--no-create-home"]
    argv += ["--home-dir", "/nonexistent", "--shell", _nologin_shell(), name]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise ServerError(
            f"running as root, PostgreSQL needs an unprivileged user {name!r}, "
            f"but {useradd} is missing; create the user yourself or run as a normal user"
        ) from None
    # "Already in use" means a concurrent launcher created it first: that is fine.
    if result.returncode not in (0, _USERADD_NAME_IN_USE):
        raise ServerError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")


def _nologin_shell() -> str:
    """The system's no-login shell (the account is for running a daemon, not for people)."""
    for shell in ("/usr/sbin/nologin", "/sbin/nologin"):
        if Path(shell).exists():
            return shell
    return "/bin/false"


def require_access(
    path: Path, account: RunAs, *, need: int, fixable_under: Path | None = None
) -> None:
    """Ensure ``account`` can search every ancestor of ``path`` and has ``need`` bits on it.

    A directory at or below ``fixable_under`` that lacks the bits gets them added for
    "other" (we only do that to our own install tree); anything else raises a
    ServerError naming the directory, because silently opening up e.g. /root is not
    ours to decide.
    """
    resolved = path.resolve()
    groups = _groups_of(account)
    for directory in reversed(resolved.parents):
        _require_bits(directory, account, groups, SEARCH, fixable_under)
    _require_bits(resolved, account, groups, need, fixable_under)


def _groups_of(account: RunAs) -> frozenset[int]:
    """All group ids (primary and supplementary) of ``account``."""
    return frozenset(os.getgrouplist(account.name, account.gid)) | {account.gid}


def _require_bits(
    path: Path, account: RunAs, groups: frozenset[int], need: int, fixable_under: Path | None
) -> None:
    """Check (and, inside ``fixable_under``, fix) that ``account`` has ``need`` on ``path``."""
    st = path.stat()
    if st.st_uid == account.uid:
        granted = (st.st_mode >> 6) & 0o7
    elif st.st_gid in groups:
        granted = (st.st_mode >> 3) & 0o7
    else:
        granted = st.st_mode & 0o7
    if granted & need == need:
        return
    if fixable_under is not None and path.is_relative_to(fixable_under.resolve()):
        path.chmod(stat.S_IMODE(st.st_mode) | need)
        return
    raise ServerError(_access_message(path, account, st, need))


def _access_message(path: Path, account: RunAs, st: os.stat_result, need: int) -> str:
    """Explain which directory blocks the unprivileged PostgreSQL account and how to fix it."""
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    group = _group_name(st.st_gid)
    bits = ("r" if need & READ else "") + ("x" if need & SEARCH else "")
    return (
        f"PostgreSQL refuses to run as root, so it runs as the unprivileged user "
        f"{account.name!r}, which cannot access {path} "
        f"(mode {stat.S_IMODE(st.st_mode):04o}, owner {owner}:{group}; needs '{bits}'). "
        f"Put the data directory somewhere reachable (e.g. under /tmp) "
        f"or run `chmod o+{bits} {path}`."
    )


def _group_name(gid: int) -> str:
    """Name of group ``gid``, or the number if it has none."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def chown_tree(path: Path, account: RunAs) -> None:
    """Give ``path`` and everything below it to ``account`` unless it already owns the top."""
    st = path.lstat()
    if st.st_uid == account.uid and st.st_gid == account.gid:
        return
    os.lchown(path, account.uid, account.gid)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), account.uid, account.gid)


def drop_privileges(account: RunAs) -> None:
    """Irrevocably become ``account`` in this process (used right before exec)."""
    os.setgroups([])
    os.setgid(account.gid)
    os.setuid(account.uid)
