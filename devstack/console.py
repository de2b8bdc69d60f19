"""The operator console's sign-in on the local stack: two accounts, passwords in files.

Written once into ``<var>/secrets`` (kept across restarts, 0600 like every secret there):
``console-password-operator`` and ``console-password-viewer`` (random), the accounts file
``console-accounts.json`` holding only their scrypt hashes, and the key that signs the
console's session cookies (``console-session-key``). ``./dev run`` prints where the
consoles listen and which file holds each password, never a password itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from devstack.credentials import secrets_of
from services.console.auth import hash_password, load_accounts, verify_password
from shared.access.identities import write_private

#: Account name → role.
ACCOUNTS = {"operator": "operator", "viewer": "read-only"}
ACCOUNTS_FILE = "console-accounts.json"
SESSION_KEY_FILE = "console-session-key"


def password_file(var_dir: Path, name: str) -> Path:
    """The file holding the password of console account ``name``."""
    return secrets_of(var_dir).root / f"console-password-{name}"


def write_console_accounts(var_dir: Path) -> Path:
    """Create the console's passwords, accounts file and session key; the accounts file."""
    secrets = secrets_of(var_dir)
    path = secrets.root / ACCOUNTS_FILE
    existing = load_accounts(path) if path.exists() else {}
    doc = {}
    for name, role in ACCOUNTS.items():
        password = secrets.ensure(password_file(var_dir, name))
        known = existing.get(name)
        keep = (
            known is not None
            and known.role == role
            and verify_password(password, known.password_hash)
        )
        doc[name] = {
            "role": role,
            "password": known.password_hash if keep and known else hash_password(password),
        }
    write_private(path, json.dumps(doc, indent=2) + "\n")
    secrets.ensure(secrets.root / SESSION_KEY_FILE)
    return path
