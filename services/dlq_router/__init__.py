"""dlq-router: JetStream's delivery advisories → one dead-letter record per (durable, message)."""
