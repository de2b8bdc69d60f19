"""The image definition: multi-stage, non-root, exec-form entry point that every workload
uses; the KPI image's entry point speaks Spark on Kubernetes' driver/executor protocol."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import K8S, ROOT, WORKLOADS, Doc, pod_spec

ENTRYPOINT = K8S / "image" / "spark-entrypoint.sh"


def _stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions of each stage of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert match, f"every stage is named: {line}"
            current = match.group(2)
            stages[current] = [("FROM", match.group(1))]
        elif current is not None:
            stages[current].append((word.upper(), rest.strip()))
    return stages


def _last(stage: list[tuple[str, str]], instruction: str) -> str:
    values = [v for i, v in stage if i == instruction]
    assert values, f"no {instruction}"
    return values[-1]


@pytest.mark.parametrize("target", ["runtime", "kpi"])
def test_final_stages_run_as_an_unprivileged_user_with_an_exec_form_entrypoint(
    target: str,
) -> None:
    stages = _stages()
    assert len(stages) >= 3, "multi-stage: dependencies are built apart from the final image"
    stage = stages["roles" if target == "runtime" else target]
    user = _last(stage, "USER")
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), f"numeric non-root user: {user}"
    entrypoint = json.loads(_last(stage, "ENTRYPOINT"))  # exec form is a JSON array
    assert isinstance(entrypoint, list) and entrypoint
    assert not any(i == "RUN" and "pip install" in v for i, v in stage), "no pip in the final stage"


def test_runtime_is_the_default_target_and_matches_the_pod_user(
    rendered: dict[str, list[Doc]],
) -> None:
    stages = _stages()
    # A build without --target gives the last stage: that must be the roles' image (the
    # KPI image was last once, and `docker build -t ferry:dev .` built Spark into it).
    assert list(stages)[-1] == "runtime"
    assert stages["runtime"][0] == ("FROM", "roles")
    assert stages["kpi"][0] == ("FROM", "roles")
    uid, gid = (int(x) for x in _last(stages["roles"], "USER").split(":"))
    for workload in (d for d in rendered["prod"] if d["kind"] in WORKLOADS):
        spec = pod_spec(workload)
        if not spec["containers"][0]["image"].startswith("ferry"):
            continue
        assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (
            uid,
            gid,
        )


def test_every_ferry_container_runs_through_the_image_entrypoint(
    rendered: dict[str, list[Doc]],
) -> None:
    """Roles pass only arguments: `python` (the entrypoint) `-m services...` as in supervisord."""
    assert json.loads(_last(_stages()["roles"], "ENTRYPOINT")) == ["python"]
    for docs in rendered.values():
        for workload in (d for d in docs if d["kind"] in WORKLOADS):
            spec = pod_spec(workload)
            for container in spec["containers"] + spec.get("initContainers", []):
                if container["image"].startswith("ferry:"):
                    assert "command" not in container
                    assert container["args"][:1] == ["-m"]
                if container["image"].startswith("ferry-kpi:"):
                    assert "command" not in container
                    assert container["args"][0] == "spark-submit"


def test_the_build_context_holds_what_the_image_copies() -> None:
    copied = {
        v.split()[0]
        for stage in _stages().values()
        for i, v in stage
        if i == "COPY" and not v.startswith("--from")
    }
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    included = {line[1:] for line in ignore if line.startswith("!")}
    for path in copied:
        assert any(path == i or path.startswith(i + "/") for i in included), path
    for path in copied:
        assert (ROOT / path).exists(), path


def _stub(bin_dir: Path, name: str) -> None:
    script = bin_dir / name
    script.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    script.chmod(0o755)


@pytest.fixture
def stub_path(tmp_path: Path) -> dict[str, str]:
    """PATH with java and spark-submit replaced by scripts that print their arguments."""
    for name in ("java", "spark-submit"):
        _stub(tmp_path, name)
    return {"PATH": f"{tmp_path}:{os.environ['PATH']}"}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, check=False
    )


def test_driver_is_submitted_in_client_mode_bound_to_the_pod(stub_path: dict[str, str]) -> None:
    env = {**stub_path, "SPARK_DRIVER_BIND_ADDRESS": "10.1.2.3"}
    proc = _run(["driver", "--properties-file", "/opt/spark/conf/p", "local:///app/x.py"], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "--conf",
        "spark.driver.bindAddress=10.1.2.3",
        "--conf",
        "spark.executorEnv.SPARK_DRIVER_POD_IP=10.1.2.3",
        "--deploy-mode",
        "client",
        "--properties-file",
        "/opt/spark/conf/p",
        "local:///app/x.py",
    ]


def test_executor_gets_its_settings_and_java_options_in_order(stub_path: dict[str, str]) -> None:
    env = {
        **stub_path,
        "SPARK_HOME": "/spark",
        "SPARK_EXECUTOR_MEMORY": "1g",
        "SPARK_DRIVER_URL": "spark://driver:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_APPLICATION_ID": "spark-abc",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "kpi-exec-3",
        "SPARK_JAVA_OPT_0": "-Dspark.a=1",
        "SPARK_JAVA_OPT_1": "-Dspark.b=two words",
        "SPARK_JAVA_OPT_3": "-Dnot.contiguous=ignored",
    }
    proc = _run(["executor"], env)
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert args[:4] == ["-Dspark.a=1", "-Dspark.b=two words", "-Xms1g", "-Xmx1g"]
    assert "-Dnot.contiguous=ignored" not in args
    assert args[args.index("-cp") + 1] == "/spark/jars/*"
    pairs = dict(zip(args[7::2], args[8::2], strict=True))
    assert args[6] == "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
    assert pairs == {
        "--driver-url": "spark://driver:7078",
        "--executor-id": "3",
        "--cores": "2",
        "--app-id": "spark-abc",
        "--hostname": "10.0.0.9",
        "--resourceProfileId": "0",
        "--podName": "kpi-exec-3",
    }


def test_other_commands_run_as_given_and_no_command_is_an_error(
    stub_path: dict[str, str],
) -> None:
    proc = _run(["spark-submit", "--master", "local[2]", "/app/spark/kpi_job.py"], stub_path)
    assert proc.stdout.splitlines() == ["--master", "local[2]", "/app/spark/kpi_job.py"]
    missing = _run([], stub_path)
    assert missing.returncode == 2 and "usage" in missing.stderr
    driver_without_address = _run(["driver"], stub_path)
    assert driver_without_address.returncode != 0
