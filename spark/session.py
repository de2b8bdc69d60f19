"""Starting Spark: find Java, check the JDBC driver, build the session.

The checks run before the JVM starts, so a missing Java or driver is a one-line error
with a distinct exit code instead of a Java stack trace. ``local[*]`` unless
FERRY_KPI_MASTER says otherwise or spark-submit already chose a master.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark.errors import JavaMissing, JdbcDriverMissing, SparkFailed
from spark.settings import KpiSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark 4 runs on Java 17 or later.
MIN_JAVA = 17
#: The class inside the jar that makes it a PostgreSQL JDBC driver.
DRIVER_ENTRY = "org/postgresql/Driver.class"
#: Default master when neither the settings nor spark-submit name one.
LOCAL_MASTER = "local[*]"
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')
_INSTALL_HINT = "install Java 17+ (Debian: apt-get install openjdk-17-jre-headless)"


@dataclass(frozen=True, slots=True)
class Java:
    """The Java that will run Spark."""

    path: Path
    major: int
    home: Path | None


def find_java(java_home: Path | None) -> Java:
    """The java binary (``java_home``/bin/java, else the one on PATH), checked for 17+."""
    if java_home is not None:
        binary = java_home / "bin" / "java"
        if not os.access(binary, os.X_OK):
            raise JavaMissing(
                f"no Java at {binary} (from FERRY_KPI_JAVA_HOME / JAVA_HOME={java_home}); "
                f"point it at a Java 17+ installation or {_INSTALL_HINT}"
            )
    else:
        found = shutil.which("java")
        if found is None:
            raise JavaMissing(
                f"no Java found: JAVA_HOME is unset and no java is on PATH; {_INSTALL_HINT} "
                "or set FERRY_KPI_JAVA_HOME"
            )
        binary = Path(found)
    major = _java_major(binary)
    if major < MIN_JAVA:
        raise JavaMissing(
            f"{binary} is Java {major}; Spark needs Java {MIN_JAVA}+: {_INSTALL_HINT}"
        )
    return Java(binary, major, java_home)


def _java_major(binary: Path) -> int:
    try:
        result = subprocess.run(
            [str(binary), "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaMissing(f"{binary} does not run: {exc}") from exc
    match = _VERSION.search(result.stderr + result.stdout)
    if result.returncode != 0 or match is None:
        raise JavaMissing(
            f"{binary} -version failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[:300]}"
        )
    first = int(match.group(1))
    # Java 8 and older say "1.8.0_x".
    return int(match.group(2) or 0) if first == 1 else first


def check_driver(jar: Path) -> None:
    """Raise :class:`JdbcDriverMissing` unless ``jar`` is a PostgreSQL JDBC driver."""
    hint = "install libpostgresql-jdbc-java (Debian) or set FERRY_KPI_JDBC_DRIVER to the jar"
    if not jar.is_file():
        raise JdbcDriverMissing(f"JDBC driver {jar} not found: {hint}")
    try:
        with zipfile.ZipFile(jar) as archive:
            archive.getinfo(DRIVER_ENTRY)
    except (zipfile.BadZipFile, OSError) as exc:
        raise JdbcDriverMissing(f"JDBC driver {jar} is not a readable jar ({exc}): {hint}") from exc
    except KeyError:
        raise JdbcDriverMissing(
            f"{jar} has no {DRIVER_ENTRY}: not the PostgreSQL driver; {hint}"
        ) from None


def spark_conf(settings: KpiSettings, *, under_submit: bool) -> dict[str, str]:
    """The configuration the session is built with (settings' extras win)."""
    conf = {
        "spark.app.name": "kpi-spark-job",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.kpi_shuffle_partitions),
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    }
    if not under_submit:
        # Given at JVM launch, the jar is on the driver's class path too (where Spark
        # resolves the JDBC schema); under spark-submit, pass --jars instead.
        conf["spark.jars"] = str(settings.kpi_jdbc_driver)
        conf["spark.master"] = settings.kpi_master or LOCAL_MASTER
    elif settings.kpi_master:
        conf["spark.master"] = settings.kpi_master
    conf.update(settings.kpi_spark_conf)
    return conf


def prepare_java(settings: KpiSettings) -> Java:
    """Check Java and the driver; export JAVA_HOME for the JVM PySpark launches."""
    java = find_java(settings.kpi_java_home)
    check_driver(settings.kpi_jdbc_driver)
    if java.home is not None:
        # PySpark's launcher reads JAVA_HOME from the environment it passes to spark-submit.
        os.environ["JAVA_HOME"] = str(java.home)
    return java


def build_session(settings: KpiSettings) -> SparkSession:
    """The SparkSession (an existing one is reused, e.g. a test's or spark-submit's)."""
    # Imported here: the checks above must answer fast, without loading PySpark.
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    under_submit = settings.pyspark_gateway_port is not None
    builder = SparkSession.builder
    for key, value in spark_conf(settings, under_submit=under_submit).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        raise JavaMissing(f"Spark's JVM did not start: {exc}") from exc
    except Py4JError as exc:
        # The JVM runs but refused the context (e.g. executor memory below Spark's minimum,
        # a master that does not answer): exit 13, never a traceback's 1 (a verdict).
        raise SparkFailed(f"Spark did not start: {_first_line(exc)}") from exc
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _first_line(exc: BaseException) -> str:
    """The Java exception's message line of a Py4J error (not the whole stack)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if line.startswith(": "):
            return line[2:][:400]
    return (lines[0] if lines else type(exc).__name__)[:400]
