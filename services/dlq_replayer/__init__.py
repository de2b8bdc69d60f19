"""dlq-replayer: automatic replays of dead letters with back-off, jitter, a cap and a rate."""
