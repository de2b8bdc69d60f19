-- Retention of the KPI job's results (issue 48): `ferry purge` deletes a topology's
-- windows and reasons older than its audit_retention. The primary keys lead with
-- (topology, window_seconds, window_start), which finds a topology's old windows only
-- one window length at a time; these indexes find them, and the oldest, at once.
-- kpi_runs already has (topology, window_seconds, started_at) and is one row per run.
CREATE INDEX IF NOT EXISTS idx_kpi_windows_age ON kpi_windows (topology, window_start);
CREATE INDEX IF NOT EXISTS idx_kpi_reasons_age ON kpi_reasons (topology, window_start);
