"""A local certificate authority for the dev stack and the tests (issue 47).

Every hop of the dev stack can run TLS with certificates this CA issues at start-up: the
CA's certificate is what clients trust (``sslrootcert`` for PostgreSQL), a server's
certificate names the hosts it answers for, a client's its role. Nothing here is for
production: there, cert-manager (or any CA) issues the same files.

Built on ``cryptography`` (the Python Cryptographic Authority's library, which ``ssl``
itself cannot replace: the standard library verifies certificates but cannot make one).
Certificates are short-lived by default (30 days) and may be made already expired, for the
tests of refusals.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long an issued certificate is valid by default (days).
VALID_DAYS = 30


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Ferry dev stack"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _san(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


class LocalCA:
    """A CA in ``folder`` (``ca.crt``, ``ca.key``): made on first use, loaded after."""

    def __init__(self, folder: Path, name: str = "Ferry dev CA") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.cert_path, key_path = folder / "ca.crt", folder / "ca.key"
        if self.cert_path.exists() and key_path.exists():
            self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            self._key = key
            return
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        _write_key(key_path, self._key)
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    @property
    def certificate(self) -> x509.Certificate:
        """The CA's own certificate."""
        return self._cert

    def issue(
        self,
        name: str,
        *,
        hosts: list[str] | None = None,
        client: bool = False,
        peer: bool = False,
        days: float = VALID_DAYS,
        expired: bool = False,
        folder: Path | None = None,
    ) -> Issued:
        """A certificate for ``name``: a server's for ``hosts`` (its subject alternative
        names), a client's (``client``: its common name is the role), or a cluster peer's
        (``peer``: both, for NATS routes). ``expired``: valid
        until yesterday, for the tests of refusals. Written to ``folder`` (the CA's)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
        if expired:
            start, end = now - dt.timedelta(days=30), now - dt.timedelta(days=1)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
        if peer:  # a node that dials its peers and is dialled by them (NATS routes)
            usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName(_san(hosts)), False)
        cert = builder.sign(self._key, hashes.SHA256())
        where = folder or self.folder
        where.mkdir(parents=True, exist_ok=True)
        stem = name.replace("/", "_")
        issued = Issued(where / f"{stem}.crt", where / f"{stem}.key")
        _write_key(issued.key, key)
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return issued


#: Renew a dev stack certificate that expires sooner than this (days).
RENEW_DAYS = 7
#: Host names the dev stack's servers answer for (everything listens on loopback).
LOOPBACK = ["127.0.0.1", "localhost", "::1"]


@dataclass(frozen=True)
class StackTLS:
    """Every certificate of the local stack, under ``<var>/tls`` (issue 47).

    One CA; a server certificate for the NATS server (also the cluster's route
    certificate: server and client use), the PostgreSQL server, the handler services and
    the consoles, each for the loopback names. Roles trust ``ca``.
    """

    folder: Path
    ca: Path
    nats: Issued
    postgres: Issued
    handlers: Issued
    consoles: Issued


def _fresh(issued: Issued, ca: LocalCA) -> bool:
    """The files exist, ``ca`` issued the certificate and it is valid for at least
    :data:`RENEW_DAYS` more."""
    if not (issued.cert.exists() and issued.key.exists()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(issued.cert.read_bytes())
        cert.verify_directly_issued_by(ca.certificate)
    except (ValueError, TypeError, InvalidSignature):
        return False
    left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    return left > dt.timedelta(days=RENEW_DAYS)


def stack_certificates(folder: Path) -> StackTLS:
    """The local stack's CA and certificates in ``folder``: kept across restarts, each
    reissued when missing or within :data:`RENEW_DAYS` of its end (the roles reload a
    renewed file by themselves)."""
    ca = LocalCA(folder)
    issued: dict[str, Issued] = {}
    for name in ("nats-server", "postgres-server", "handlers", "consoles"):
        current = Issued(folder / f"{name}.crt", folder / f"{name}.key")
        if not _fresh(current, ca):
            current = ca.issue(name, hosts=LOOPBACK, peer=name == "nats-server")
        issued[name] = current
    return StackTLS(
        folder=folder,
        ca=ca.cert_path,
        nats=issued["nats-server"],
        postgres=issued["postgres-server"],
        handlers=issued["handlers"],
        consoles=issued["consoles"],
    )
