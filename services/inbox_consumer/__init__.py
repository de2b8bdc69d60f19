"""inbox-consumer: pulls one durable, records the inbox, dispatches to the handler, acks."""
