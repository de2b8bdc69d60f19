"""outbox-publisher: moves committed outbox rows of one context into its JetStream stream."""
