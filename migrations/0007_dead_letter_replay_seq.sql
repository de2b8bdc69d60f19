-- The stream sequence of a dead letter's replay, apart from the sequence of the failure
-- that was recorded (dead_letters.stream_seq).
--
-- A failure belongs to the replay in flight only when its stream sequence is greater than
-- the recorded failure's: a replay is published into the same stream, so it always gets a
-- higher sequence. Overwriting stream_seq with the replay's sequence when the publish was
-- confirmed left a window (mark 'replaying' → confirm) in which a late MSG_TERMINATED
-- advisory for the original delivery looked like a failed replay: a second record, a
-- replay attempt spent, the replay itself acked as a duplicate.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS replay_stream_seq BIGINT;
