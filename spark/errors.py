"""Why the KPI job stopped, as named exit codes (a release gate and supervisord read them).

=====  ==============================================================================
code   meaning
=====  ==============================================================================
0      every verdict passed (or there was no new complete window)
1      a PRD-022 target was missed (delivery, duplicates, dead letters, p99, lost events)
2      configuration error: settings, topology, command line, a grant the login lacks
3      a database is unreachable (or refused the login)
4      an INFRA-005 P0 alert fired (lag, dead-letter spike, success ratio); targets met
10     no usable Java (17 or later) to run Spark
11     the PostgreSQL JDBC driver jar is missing or not a driver
12     a table the job needs is missing: run ``ferry migrate``
13     Spark failed for another reason (see the log)
14     another run for the same topology and window length holds the lock
=====  ==============================================================================
"""

from __future__ import annotations

from shared.runtime.lifecycle import EXIT_CONFIG, EXIT_CONNECT, EXIT_OK

EXIT_SLO_BREACH = 1
EXIT_ALERT = 4
EXIT_NO_JAVA = 10
EXIT_NO_JDBC_DRIVER = 11
EXIT_SCHEMA = 12
EXIT_SPARK = 13
EXIT_LOCKED = 14

#: What each exit code means, in a few words (logs, the demo).
MEANINGS = {
    EXIT_OK: "every verdict passed",
    EXIT_SLO_BREACH: "a PRD-022 target was missed",
    EXIT_CONFIG: "configuration error",
    EXIT_CONNECT: "a database is unreachable",
    EXIT_ALERT: "an INFRA-005 alert fired",
    EXIT_NO_JAVA: "no usable Java 17+",
    EXIT_NO_JDBC_DRIVER: "PostgreSQL JDBC driver missing",
    EXIT_SCHEMA: "tables missing (run ferry migrate)",
    EXIT_SPARK: "Spark failed",
    EXIT_LOCKED: "another run holds the lock",
}

__all__ = [
    "EXIT_ALERT",
    "EXIT_CONFIG",
    "EXIT_CONNECT",
    "EXIT_LOCKED",
    "EXIT_NO_JAVA",
    "EXIT_NO_JDBC_DRIVER",
    "EXIT_OK",
    "EXIT_SCHEMA",
    "EXIT_SLO_BREACH",
    "EXIT_SPARK",
    "MEANINGS",
    "AccessDenied",
    "DatabaseUnreachable",
    "JavaMissing",
    "JdbcDriverMissing",
    "JobError",
    "RunLocked",
    "SchemaMissing",
    "SparkFailed",
]


class JobError(Exception):
    """An error that ends the run with :attr:`exit_code` and a message for the operator."""

    exit_code = EXIT_SPARK


class JavaMissing(JobError):
    """No Java 17+ found (FERRY_KPI_JAVA_HOME, JAVA_HOME, PATH)."""

    exit_code = EXIT_NO_JAVA


class JdbcDriverMissing(JobError):
    """The PostgreSQL JDBC driver jar is absent or is not the driver."""

    exit_code = EXIT_NO_JDBC_DRIVER


class AccessDenied(JobError):
    """The job's login lacks a grant it needs (``ferry db-roles`` gives them)."""

    exit_code = EXIT_CONFIG


class DatabaseUnreachable(JobError):
    """A database did not answer (or refused the login)."""

    exit_code = EXIT_CONNECT


class SchemaMissing(JobError):
    """A table the job reads or writes does not exist."""

    exit_code = EXIT_SCHEMA


class SparkFailed(JobError):
    """Spark failed for a reason of its own."""

    exit_code = EXIT_SPARK


class RunLocked(JobError):
    """Another run for this topology and window length is in progress."""

    exit_code = EXIT_LOCKED
