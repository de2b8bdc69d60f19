"""The operator console: a web page for lag, failures, replays and one event's journey.

``python -m services.console [--topology F]`` serves one topology's console (one process
per topology, like the dlq-router), server-rendered HTML that reads without JavaScript:

* **Overview** — per context the outbox backlog and its oldest age, per durable the inbox
  rows waiting and, apart, those dead-lettered, the consumer lag (messages, seconds),
  processing rate, success ratio and dead letters by reason, with sparklines of the last
  hour (samples kept in memory) and the alert thresholds drawn on them; per role its
  liveness (its /healthz, ``FERRY_CONSOLE_ROLE_HEALTH``), a durable whose consumer is down
  marked at once;
* **Failures** — dead letters grouped by durable, reason code and a fingerprint of the
  last error; replay (at a rate, with progress, cancellable), park or discard a group or
  one entry with a reason, after a dry run; parked keys of ordered durables;
* **Event** — search by message id, correlation id, aggregate or subject; the journey
  ``ferry where`` prints, the trace's spans, a link to the tracing UI (``FERRY_TRACE_URL``);
* **KPI** — the latest reports of the KPI job with their plots and verdicts.

Every action goes through the use-cases the ``ferry`` CLI runs (shared/ops), so the page
and the command are one code path with one audit trail (``dead_letter_actions``,
``parked_actions``). Sign-in is required (accounts with scrypt password hashes from a
file, or a bearer token), with a read-only and an operator role; every form carries a
CSRF token. Its PostgreSQL login and NATS user are its own (``console-{topology}``).
"""
