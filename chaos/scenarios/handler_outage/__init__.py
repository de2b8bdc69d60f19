"""``handler-outage``: the SEA -> VibesPro lane's handler down for minutes while events keep
arriving, with the durable's shipped clocks, the circuit breaker on or off (issue 45;
:mod:`chaos.scenarios.handler_outage.run`)."""
