"""kpi-spark-job: prove (or disprove) from the databases that Ferry keeps its promises.

    python -m spark.kpi_job [options]
    spark-submit --jars /usr/share/java/postgresql.jar spark/kpi_job.py [options]

The options, the settings and the exit codes are in :mod:`spark.cli` and docs/how-to/run-kpi-job.md.
This file is only the launcher: spark-submit runs it as a script, with ``spark/`` first
on ``sys.path`` and the repository root nowhere, so it puts the root there (and takes
``spark/`` out: its modules must not shadow top-level ones) before importing the job.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _make_importable() -> None:
    here = Path(__file__).resolve().parent
    root = str(here.parent)
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        sys.path.pop(0)
    if root not in sys.path:
        sys.path.insert(0, root)


def main(argv: list[str] | None = None) -> int:
    """Run the job; the return value is the exit code."""
    _make_importable()
    from spark.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
