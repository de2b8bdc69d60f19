"""kpi-spark-job: Ferry's KPI and SLO batch job on PySpark (``python -m spark.kpi_job``).

Reads every context database of a topology over JDBC, reconciles outboxes with inboxes
and dead letters, and judges PRD-022's targets and INFRA-005's alert conditions per
context, durable, subject and window. See docs/reference/kpi.md.
"""
