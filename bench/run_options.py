"""The command line of ``python -m bench``: the sections it knows, the sizes of a full and
a ``--quick`` run, the flags (:func:`parse_args`), and their checks into the run's
:class:`bench.sections.Options` (:func:`options_from`, with ``--set``'s
:func:`role_settings`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import sections as s
from bench.sections.retention_soak import SHORTEST
from bench.world import set_traces_ratio

SECTIONS = (
    "baselines",
    "prototype",
    "peer",
    "publisher",
    "drain",
    "latency",
    "sustained",
    "mediation",
    "tls",
    "soak",
    "volume",
    "retention-soak",
)
#: Sections a run leaves out unless ``--sections`` names them (minutes of seeding).
OPT_IN = ("volume", "retention-soak")

#: Sizes of a full run, and of ``--quick`` (a smoke run of a minute or two).
FULL = {"rows": 100_000, "seconds": 30.0, "sustain_start": 1200, "sustain_step": 300,
        "sustain_max": 4000, "soak_seconds": 600.0, "soak_rate": 1000, "warmup": 5.0,
        "baseline_seconds": 10.0}  # fmt: skip
QUICK = {"rows": 1000, "seconds": 2.0, "sustain_start": 300, "sustain_step": 300,
         "sustain_max": 600, "soak_seconds": 6.0, "soak_rate": 200, "warmup": 1.0,
         "baseline_seconds": 1.5}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Ferry's benchmark: roles as processes, raw baselines, one table.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke-run sizes (seconds, not minutes); explicit flags still win",
    )
    parser.add_argument("--rows", type=int, help="backlog size of the drains (100,000)")
    parser.add_argument(
        "--peer-rows", type=int, help="backlog of the faststream-outbox drain (default: --rows)"
    )
    parser.add_argument("--seconds", type=float, help="duration of each fixed-rate step (30)")
    parser.add_argument(
        "--rates",
        default="600,1000,1500",
        help="offered loads of the latency section, msg/s (600,1000,1500)",
    )
    parser.add_argument(
        "--mediation-rate",
        type=int,
        default=600,
        help="offered load into lane E→F, forwarded F→G (600)",
    )
    parser.add_argument("--sustain-start", type=int, help="first step of the search (1200)")
    parser.add_argument("--sustain-step", type=int, help="increment of the search (300)")
    parser.add_argument("--sustain-max", type=int, help="ceiling of the search (4000)")
    parser.add_argument("--soak-seconds", type=float, help="length of the soak (600)")
    parser.add_argument("--soak-rate", type=int, help="offered load of the soak (1000)")
    parser.add_argument("--warmup", type=float, help="warm-up at 200 msg/s before latency (5)")
    parser.add_argument(
        "--baseline-seconds", type=float, help="duration of the PostgreSQL and HTTP baselines (10)"
    )
    parser.add_argument(
        "--tracing",
        choices=["on", "off", "both"],
        default="both",
        help="tracing modes of the Ferry sections (both)",
    )
    parser.add_argument(
        "--trace-ratio", type=float, default=0.1,
        help="sampling ratio of tracing on: the roles' parentbased_traceidratio and the "
        "share of backlog rows stored with a sampled traceparent (0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--sections",
        default=",".join(s for s in SECTIONS if s not in OPT_IN),
        help=f"comma-separated, from: {', '.join(SECTIONS)} (all but {', '.join(OPT_IN)})",
    )
    parser.add_argument("--skip", default="", help="comma-separated sections to leave out")
    parser.add_argument(
        "--peer-workers", type=int, default=32, help="faststream-outbox max_workers (32)"
    )
    parser.add_argument(
        "--producer-connections", type=int, default=16,
        help="the producer's pool: one transaction per event on each (16)",
    )  # fmt: skip
    parser.add_argument(
        "--producer-form", choices=("transaction", "statement"), default="transaction",
        help="each event as a transaction (BEGIN, upsert, record_event, COMMIT: an "
        "application's usual form) or as one statement (record_event_with)",
    )  # fmt: skip
    parser.add_argument(
        "--drain-budget", type=float, default=600.0,
        help="longest wait for one drain; a slower one is reported as partial (600 s)",
    )  # fmt: skip
    parser.add_argument(
        "--statements", action="store_true",
        help="load pg_stat_statements and write each measurement's statements per message "
             "to statements.txt (a profiling aid: it costs PostgreSQL some CPU)",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="role_settings", action="append", default=[], metavar="FERRY_NAME=VALUE",
        help="a setting every role gets, e.g. FERRY_LINGER=0 (repeatable; recorded in "
             "results.json): for comparing settings on the same machine",
    )  # fmt: skip
    parser.add_argument(
        "--ordered-partitions", type=int, default=4,
        help="partitions of the ordered drain's stream (4)",
    )  # fmt: skip
    parser.add_argument(
        "--ordered-replicas", type=int, default=2,
        help="consumer replicas of the ordered drain (2)",
    )  # fmt: skip
    parser.add_argument(
        "--handler-batch", type=int, default=50,
        help="events per handler call in the batch-call drain (handler.batch; 50)",
    )  # fmt: skip
    parser.add_argument(
        "--drain-pairs", type=int, default=2,
        help="with --tracing both, times the one-consumer drain runs in each mode, in "
        "pairs whose order alternates (on, off, off, on): its figures are all events "
        "over all their time (2)",
    )  # fmt: skip
    parser.add_argument(
        "--tls-rate", type=int, default=600,
        help="offered load of the TLS section's latency step, TLS off and on (600)",
    )  # fmt: skip
    parser.add_argument(
        "--tls-pairs", type=int, default=2,
        help="pairs of each drain of the TLS section (publisher, one consumer), TLS on and "
        "off, their order alternating (2)",
    )  # fmt: skip
    parser.add_argument(
        "--volume-scale", type=_volume_scale, default=1.0,
        help="the volume section's history: the issue's sizes (10,000,000 inbox rows ...) "
        "times this (1)",
    )  # fmt: skip
    parser.add_argument(
        "--soak-retention", type=_soak_retention, default=120.0,
        help="the retention soak's retention of every table, seconds (120)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="output directory (bench/results/<time>)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (server data) for inspection",
    )
    return parser.parse_args(argv)


def _soak_retention(text: str) -> float:
    """The retention soak's retention: at least its SHORTEST (what ferry lint allows)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds >= SHORTEST:
        raise argparse.ArgumentTypeError(f"{text!r}: at least {SHORTEST:g} seconds")
    return seconds


def _volume_scale(text: str) -> float:
    value = float(text)
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError("above 0 and at most 10")
    return value


def options_from(args: argparse.Namespace) -> s.Options:
    sizes = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        return sizes[name] if value is None else value

    chosen = {x.strip() for x in args.sections.split(",") if x.strip()}
    chosen -= {x.strip() for x in args.skip.split(",") if x.strip()}
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--sections: unknown {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(SECTIONS)}")  # fmt: skip
    try:
        rates = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        raise SystemExit(
            f"--rates: {args.rates!r} is not a comma-separated list of integers"
        ) from None
    rows = int(pick("rows"))
    if not 2 <= args.handler_batch <= 1000:
        raise SystemExit("--handler-batch must be between 2 and 1000")
    if not 1 <= args.drain_pairs <= 10:
        raise SystemExit("--drain-pairs must be between 1 and 10")
    if not 1 <= args.tls_pairs <= 10:
        raise SystemExit("--tls-pairs must be between 1 and 10")
    if args.tls_rate < 1:
        raise SystemExit("--tls-rate must be at least 1 msg/s")
    if args.ordered_partitions < 1 or args.ordered_replicas < 1:
        raise SystemExit("--ordered-partitions and --ordered-replicas must be at least 1")
    modes = ["on", "off"] if args.tracing == "both" else [args.tracing]
    if not 0.0 <= args.trace_ratio <= 1.0:
        raise SystemExit("--trace-ratio must be between 0 and 1")
    set_traces_ratio(args.trace_ratio)
    return s.Options(
        rows=rows, peer_rows=args.peer_rows or rows, seconds=float(pick("seconds")),
        rates=rates, mediation_rate=args.mediation_rate,
        sustain_start=int(pick("sustain_start")), sustain_step=int(pick("sustain_step")),
        sustain_max=int(pick("sustain_max")), soak_seconds=float(pick("soak_seconds")),
        soak_rate=int(pick("soak_rate")), warmup_seconds=float(pick("warmup")),
        modes=modes, sections=chosen, peer_workers=args.peer_workers,
        drain_budget=args.drain_budget, producer_connections=args.producer_connections,
        producer_form=args.producer_form,
        baseline_seconds=float(pick("baseline_seconds")), statements=args.statements,
        role_settings=role_settings(args.role_settings),
        ordered_partitions=args.ordered_partitions, ordered_replicas=args.ordered_replicas,
        handler_batch=args.handler_batch, drain_pairs=args.drain_pairs,
        tls_rate=args.tls_rate, tls_pairs=args.tls_pairs, volume_scale=args.volume_scale,
        soak_retention=args.soak_retention,
    )  # fmt: skip


#: Settings the bench gives the roles itself: a --set of one would break the deployment.
BENCH_OWNED = frozenset(
    {"topology", "nats_url", "databases", "health_port", "handler_url", "max_stream_replicas",
     "max_stream_bytes", "log_level", "traces_exporter", "otlp_protocol", "otlp_endpoint",
     "traces_sampler", "traces_sampler_arg"}
)  # fmt: skip
#: OpenTelemetry SDK variables a role's tracing reads as is (the batch span processor's).
OTEL_PASSED = ("OTEL_BSP_",)


def role_settings(pairs: list[str]) -> dict[str, str]:
    """``--set FERRY_NAME=VALUE`` pairs, each naming a setting some role reads.

    ``OTEL_BSP_*`` (the SDK's batch span processor: export delay, batch and queue sizes)
    pass as well, unchecked beyond their prefix: the SDK reads them itself.
    """
    from services.handlers.settings import HandlerSettings
    from shared.runtime import settings as ferry

    known: set[str] = set()
    for cls in (ferry.PublisherSettings, ferry.ConsumerSettings, ferry.RouterSettings,
                ferry.ReplayerSettings, HandlerSettings):  # fmt: skip
        known.update(cls.model_fields)
    chosen: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        field_name = name.removeprefix("FERRY_").lower()
        if sep and name.startswith(OTEL_PASSED) and value.strip():
            chosen[name] = value.strip()
            continue
        if not sep or not name.startswith("FERRY_") or not value.strip():
            raise SystemExit(f"--set {pair!r}: expected FERRY_NAME=VALUE, e.g. FERRY_LINGER=0")
        if field_name in BENCH_OWNED:
            raise SystemExit(f"--set {name}: the bench sets this one itself")
        if field_name not in known:
            raise SystemExit(f"--set {name}: no role has a setting {field_name!r} "
                             "(see docs/reference/settings.md)")  # fmt: skip
        chosen[name] = value.strip()
    return chosen
