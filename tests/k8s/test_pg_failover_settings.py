"""The CloudNativePG example carries what the failover drill proved (issue 28).

``python -m chaos.run --scenario pg-failover`` (tests/chaos/test_pg_failover_scenario.py)
shows on two real servers that with a COMMIT waiting for one standby's flush
(``synchronous_standby_names`` with one standby, ``synchronous_commit = on``) the primary
can be SIGKILLed and the standby promoted without losing a commit acknowledged to a
producer, and that roles connecting to "whichever server is writable" carry on by
themselves. Here: the rendered example asks CloudNativePG for exactly that, and the roles'
DSNs name its read-write service.
"""

from __future__ import annotations

from tests.k8s.conftest import Doc

#: synchronous_commit values that wait for the standby to have the commit (flushed or
#: applied); "on" is what the drill ran.
WAITS_FOR_STANDBY = {"on", "remote_apply"}


def _cluster(rendered: dict[str, list[Doc]]) -> Doc:
    [cluster] = [d for d in rendered["cnpg"] if d["kind"] == "Cluster"]
    return cluster


def test_commits_wait_for_a_standby_even_with_none_left(rendered: dict[str, list[Doc]]) -> None:
    spec = _cluster(rendered)["spec"]
    sync = spec["postgresql"]["synchronous"]
    assert sync["method"] in ("any", "first")
    assert sync["number"] >= 1
    # A standby to wait for, and one more to fail over to while the lost one is re-created.
    assert spec["instances"] >= sync["number"] + 2
    # No silent fallback to asynchronous commits when the standbys are gone.
    assert sync["dataDurability"] == "required"
    params = spec["postgresql"].get("parameters", {})
    assert params.get("synchronous_commit", "on") in WAITS_FOR_STANDBY


def test_roles_reach_the_read_write_service(rendered: dict[str, list[Doc]]) -> None:
    name = _cluster(rendered)["metadata"]["name"]
    for overlay in ("prod", "dev"):
        [settings] = [
            d
            for d in rendered[overlay]
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("ferry-settings")
        ]
        hostport = settings["data"]["PG_HOSTPORT"]
        if overlay == "prod":
            assert hostport == f"{name}-rw:5432"
        else:  # the dev overlay's own single server
            assert hostport == "postgres:5432"
