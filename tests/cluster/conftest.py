"""A 3-node JetStream cluster for one test (:class:`devstack.nats_cluster.NatsCluster`).

Three nats-server processes from the wheel, each on free ports with its own store, the
production settings (file store, ``sync_interval: always``, explicit routes), and the same
per-role authorization as the single test server (:func:`tests.conftest.nats_access`).
The fixture returns once the cluster has a meta leader and every node is current.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from devstack.nats_cluster import CLUSTER_SIZE, NatsCluster, RouteTLS
from shared.access.identities import NATS_ADMIN
from shared.adapters.nats import NatsAuth
from tests.conftest import NATS_ACCESS, TLS, nats_access, nats_tls_block


def cluster_admin(cluster: NatsCluster) -> NatsAuth:
    """The admin's credentials on every node of ``cluster``."""
    assert cluster.access is not None
    return cluster.access.auth(NATS_ADMIN)


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three clustered nats-server nodes with JetStream, ready (a meta leader, all current);
    clients and routes on TLS with the session's certificates, as the dev stack's cluster."""
    route = RouteTLS(TLS.nats.cert, TLS.nats.key, TLS.ca)
    cluster = NatsCluster(
        tmp_path / "cluster",
        access=nats_access(),
        extra=nats_tls_block(),
        route_tls=[route] * CLUSTER_SIZE,
    )
    cluster.start()
    assert cluster.access is not None
    NATS_ACCESS[cluster.url] = cluster.access
    try:
        yield cluster
    finally:
        NATS_ACCESS.pop(cluster.url, None)
        cluster.kill()


@pytest.fixture
async def cluster_nc(nats_cluster: NatsCluster) -> AsyncIterator[NATS]:
    """The admin, connected with the cluster's seed list."""
    options = cluster_admin(nats_cluster).options(nats_cluster.urls)
    client = await asyncio.wait_for(
        nats.connect(servers=nats_cluster.urls, reconnect_time_wait=0.2, **options), timeout=10
    )
    try:
        yield client
    finally:
        await client.close()
