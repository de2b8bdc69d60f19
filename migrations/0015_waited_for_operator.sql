-- Which events waited for an operator (issue 42): the KPI job gives their latency apart
-- from the pipeline's own, and `ferry where` names the held head an event waited behind.
--
-- parked_messages.held_head  the held head (on_dead_letter: hold) this parked event waited
--                            behind: set when it is parked behind a held head, or when its
--                            key's head becomes held while it waits.
-- inbox_messages.held_by     the same id, copied to the inbox row when the event is released
--                            (in the transaction that releases it); NULL for an event that
--                            never waited behind a held head.
-- A dead-lettered event that was replayed needs no column: its dead letter says so.
ALTER TABLE parked_messages ADD COLUMN IF NOT EXISTS held_head UUID;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS held_by UUID;
