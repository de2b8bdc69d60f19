"""Multi-host DSNs (a primary and its standby) as JDBC URLs: hosts in order, the libpq
``target_session_attrs`` translated to pgJDBC's ``targetServerType``, the passfile per host."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devstack.postgres_pair import PostgresPair, multi_host_dsn
from shared.domain.errors import ConfigurationError
from spark.jdbc import jdbc_target


def test_a_primary_and_standby_pair_become_one_jdbc_url() -> None:
    target = jdbc_target(
        "postgresql://ferry@pg-a:5432,[fd00::2]:5433,pg-c/sea?target_session_attrs=read-write"
    )
    assert target.url == (
        "jdbc:postgresql://pg-a:5432,[fd00::2]:5433,pg-c:5432/sea?targetServerType=primary"
    )
    assert target.properties["user"] == "ferry"
    assert target.database == "sea"


@pytest.mark.parametrize(
    ("attrs", "server_type"),
    [
        ("read-write", "primary"),
        ("primary", "primary"),
        ("read-only", "secondary"),
        ("standby", "secondary"),
        ("prefer-standby", "preferSecondary"),
        ("any", "any"),
    ],
)
def test_target_session_attrs_are_translated(attrs: str, server_type: str) -> None:
    url = jdbc_target(f"postgresql://u@h1,h2/db?target_session_attrs={attrs}").url
    assert url == f"jdbc:postgresql://h1:5432,h2:5432/db?targetServerType={server_type}"


@given(
    st.text(min_size=1, max_size=20).filter(
        lambda v: (
            v not in {"read-write", "primary", "read-only", "standby", "prefer-standby", "any"}
        )
    )
)
def test_unknown_target_session_attrs_are_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigurationError, match="target_session_attrs") as info:
        jdbc_target(f"postgresql://u@h1,h2/db?target_session_attrs={quote(value)}", what="D")
    assert repr(value) in str(info.value)
    assert "read-write" in str(info.value) and "prefer-standby" in str(info.value)


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("postgresql://h1,/db", "TCP host"),
        ("postgresql://h1:5432,h2:99999/db", "'99999' of host 'h2'"),
        ("postgresql://h1,h2:x/db", "'x' of host 'h2'"),
        ("postgresql://h1,[fd00::1/db", "IPv6"),
        ("postgresql://h1,[fd00::1]x/db", "IPv6"),
        ("postgresql://h1,%2Frun%2Fpostgresql/db", "TCP host"),
    ],
)
def test_bad_host_lists_are_refused_by_name(dsn: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[")):
        jdbc_target(dsn)


_NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)
_V6 = st.integers(1, 2**128 - 1).map(lambda n: str(ipaddress.IPv6Address(n)))
_V4 = st.integers(1, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
_SERVERS = st.lists(
    st.tuples(st.one_of(_NAMES, _V4, _V6), st.none() | st.integers(1, 65535)),
    min_size=1,
    max_size=5,
)


@given(_SERVERS)
def test_generated_host_lists_keep_their_order_and_ports(
    servers: list[tuple[str, int | None]],
) -> None:
    def shown(host: str, port: int | None) -> str:
        host = f"[{host}]" if ":" in host else host
        return host if port is None else f"{host}:{port}"

    dsn = f"postgresql://u@{','.join(shown(h, p) for h, p in servers)}/db"
    url = jdbc_target(dsn).url
    assert url == ("jdbc:postgresql://" + ",".join(shown(h, p or 5432) for h, p in servers) + "/db")


def test_the_passfile_is_searched_for_each_host_in_turn(tmp_path: Path) -> None:
    passfile = tmp_path / "pgpass"
    passfile.write_text("pg-a:5432:sea:other:nope\npg-b:5433:sea:ferry:s3cret\n")
    dsn = f"postgresql://ferry@pg-a:5432,pg-b:5433/sea?passfile={passfile}"
    assert jdbc_target(dsn).properties["password"] == "s3cret"
    # the same password for both hosts is fine; different ones cannot work with one JDBC login
    passfile.write_text("pg-a:5432:sea:ferry:s3cret\npg-b:*:*:ferry:s3cret\n")
    assert jdbc_target(dsn).properties["password"] == "s3cret"
    passfile.write_text("pg-a:5432:sea:ferry:pw-alpha\npg-b:5433:sea:ferry:pw-beta\n")
    with pytest.raises(ConfigurationError, match="pg-a:5432 and pg-b:5433") as info:
        jdbc_target(dsn)
    assert "pw-" not in str(info.value)  # errors never show a password
    passfile.write_text("elsewhere:*:*:*:x\n")
    assert "password" not in jdbc_target(dsn).properties


def test_the_devstack_pair_dsn_names_both_servers(tmp_path: Path) -> None:
    pair = PostgresPair(tmp_path / "pair")  # not started: the DSN is all this needs
    first, second = pair.servers
    url = jdbc_target(pair.dsn("sea")).url
    assert url == (
        f"jdbc:postgresql://{first.host}:{first.port},{second.host}:{second.port}/sea"
        "?targetServerType=primary"
    )
    v6 = jdbc_target(multi_host_dsn([("::1", 5432), ("::1", 5433)], "sea")).url
    assert v6.startswith("jdbc:postgresql://[::1]:5432,[::1]:5433/sea?")
