"""``long-outage``: every role's NATS link down, then NATS silent past every attempt cap, then
one handler away (:mod:`chaos.scenarios.long_outage.play`)."""
