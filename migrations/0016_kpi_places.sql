-- Where every expected delivery is (issue 42, shared/domain/whereabouts.py): the KPI rows
-- count the deliveries that are not final yet by place, so that "lost" means lost only,
-- and give the latency of events that waited for an operator apart from the pipeline's own.
--
-- parked                 waiting in parked_messages behind its key's head (or that head,
--                        retrying); never lost
-- retrying               inbox row not final, a delivery of it failed before
-- in_flight              inbox row not final, nothing failed yet; or published within the
--                        grace period and not received yet
-- waited                 processed after an operator's move: its dead letter was replayed,
--                        or it was released from behind a held head (inbox held_by, 0015)
-- waited_latency_*_ms    their end-to-end latency; latency_p50/p95/p99/max_ms and the
--                        latency target cover the others only (the pipeline's own)
ALTER TABLE kpi_windows
  ADD COLUMN IF NOT EXISTS parked BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS retrying BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS in_flight BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS waited BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS waited_latency_p99_ms DOUBLE PRECISION,
  ADD COLUMN IF NOT EXISTS waited_latency_max_ms DOUBLE PRECISION;
