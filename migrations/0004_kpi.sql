-- The KPI job's results (spark/, issue 8): PRD-022 success metrics and INFRA-005 §6
-- monitoring per window, with their verdicts, written idempotently per window.
--
-- `ferry migrate` applies this to every context database, but the job writes to ONE of
-- them: FERRY_KPI_DATABASE, by default the database of the topology's first context
-- (sea for sea-vibespro, mediation_e for mediation). The tables stay empty elsewhere.
-- Every row is keyed by the topology name and the window length, so several topologies
-- (or window lengths) can share one KPI database without touching each other's rows.

-- One row per (window, producing context, durable, subject). subject '*' rolls up every
-- subject of the durable; durable '-' holds events no durable subscribes to (they count
-- for the delivery rate only). A window is [window_start, window_start + window_seconds)
-- of the events' occurred_at; its row says what happened to those events, whenever.
CREATE TABLE IF NOT EXISTS kpi_windows (
  topology TEXT NOT NULL,
  window_seconds INT NOT NULL CHECK (window_seconds > 0),
  window_start TIMESTAMPTZ NOT NULL,
  window_end TIMESTAMPTZ NOT NULL,
  context TEXT NOT NULL,
  durable TEXT NOT NULL,
  subject TEXT NOT NULL,
  target_context TEXT,

  produced BIGINT NOT NULL,
  published BIGINT NOT NULL,
  received BIGINT NOT NULL,
  processed BIGINT NOT NULL,
  dead_lettered BIGINT NOT NULL,
  handler_409 BIGINT NOT NULL,
  duplicate_deliveries BIGINT NOT NULL,
  retries BIGINT NOT NULL,
  attempts BIGINT NOT NULL,
  lost_candidates BIGINT NOT NULL,

  delivery_rate DOUBLE PRECISION,
  duplicate_rate DOUBLE PRECISION,
  dlq_rate DOUBLE PRECISION,
  retry_rate DOUBLE PRECISION,
  success_ratio DOUBLE PRECISION,
  latency_p50_ms DOUBLE PRECISION,
  latency_p95_ms DOUBLE PRECISION,
  latency_p99_ms DOUBLE PRECISION,
  latency_max_ms DOUBLE PRECISION,
  lag_p50_ms DOUBLE PRECISION,
  lag_max_ms DOUBLE PRECISION,

  -- PRD-022 targets this row misses, and INFRA-005 P0 alerts it raises (durable rows).
  slo_breaches TEXT[] NOT NULL DEFAULT '{}',
  alerts TEXT[] NOT NULL DEFAULT '{}',

  PRIMARY KEY (topology, window_seconds, window_start, context, durable, subject)
);

-- Retries and dead letters by reason code, same grain plus (kind, reason_code).
CREATE TABLE IF NOT EXISTS kpi_reasons (
  topology TEXT NOT NULL,
  window_seconds INT NOT NULL,
  window_start TIMESTAMPTZ NOT NULL,
  context TEXT NOT NULL,
  durable TEXT NOT NULL,
  subject TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('retry', 'dead_letter')),
  reason_code TEXT NOT NULL,
  count BIGINT NOT NULL,
  rate DOUBLE PRECISION,
  PRIMARY KEY (topology, window_seconds, window_start, context, durable, subject, kind,
               reason_code)
);

-- The incremental watermark: every window that ends at or before it is done.
CREATE TABLE IF NOT EXISTS kpi_watermarks (
  topology TEXT NOT NULL,
  window_seconds INT NOT NULL,
  watermark TIMESTAMPTZ NOT NULL,
  run_id UUID NOT NULL,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (topology, window_seconds)
);

-- One row per run that wrote results: what it covered and what it concluded.
CREATE TABLE IF NOT EXISTS kpi_runs (
  run_id UUID PRIMARY KEY,
  topology TEXT NOT NULL,
  window_seconds INT NOT NULL,
  range_start TIMESTAMPTZ NOT NULL,
  range_end TIMESTAMPTZ NOT NULL,
  as_of TIMESTAMPTZ NOT NULL,
  incremental BOOLEAN NOT NULL,
  windows INT NOT NULL,
  events BIGINT NOT NULL,
  verdict TEXT NOT NULL,
  exit_code INT NOT NULL,
  report_dir TEXT,
  started_at TIMESTAMPTZ NOT NULL,
  finished_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX IF NOT EXISTS idx_kpi_runs_topology ON kpi_runs (topology, window_seconds, started_at);

-- The job reads each run's range by occurred_at. BRIN indexes cost next to nothing on the
-- write path (rows arrive roughly in occurred_at order) and spare a full scan per run.
CREATE INDEX IF NOT EXISTS idx_outbox_occurred_brin ON outbox_events USING brin (occurred_at);
CREATE INDEX IF NOT EXISTS idx_inbox_occurred_brin ON inbox_messages USING brin (occurred_at);
