"""``python -m k8s.podman image | up | down | status``, behind ``./dev image`` and ``./dev kube``.

image [--kpi] [--python-image IMAGE]   build the images (k8s/podman/image.py)
up [--demo] [--timeout S]              play the dev overlay (k8s/podman/play.py);
                                       --demo then drives the demo workload and ends
                                       with the same summary as ./dev run
down                                   remove every pod, stop the prober
status                                 the probes' tallies and readiness, per pod
"""

from __future__ import annotations

import argparse
import json
import sys

from k8s.podman import host, image, play
from k8s.podman.overlay import OverlayError, Plan


def _demo(plan: Plan, argv: list[str]) -> int:
    from devstack.demo import run_demo

    by_name = {w.name: w for w in plan.servers}
    pg_ip = by_name["postgres"].ip
    nats_ip = by_name["nats"].ip
    var = play.var_dir()
    secrets = play.secrets(var)
    pg_password = secrets["postgres-dev"]["POSTGRES_PASSWORD"]
    nats_password_file = var / "admin-nats-password"
    nats_password_file.write_text(secrets["ferry-admin"]["nats-password"])
    nats_password_file.chmod(0o600)
    env = {
        "FERRY_DSN_TEMPLATE": f"postgresql://postgres:{pg_password}@{pg_ip}:5432/{{database}}",
        "FERRY_NATS_URL": f"nats://{nats_ip}:4222",
        "FERRY_NATS_USER": "ferry-admin",
        "FERRY_NATS_PASSWORD_FILE": str(nats_password_file),
    }
    return run_demo(env, argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k8s.podman", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_image = sub.add_parser("image", help="build the images")
    p_image.add_argument("--kpi", action="store_true", help="also the KPI job's image")
    p_image.add_argument(
        "--python-image", help="base image with Python 3.11 (default: Debian's, built here)"
    )
    p_up = sub.add_parser("up", help="play the dev overlay")
    p_up.add_argument("--demo", action="store_true", help="then drive the demo workload")
    p_up.add_argument("--timeout", type=float, default=1500.0, help="seconds for every pod ready")
    sub.add_parser("down", help="remove every pod")
    sub.add_parser("status", help="probe tallies per pod")
    sub.add_parser("probe", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    try:
        return COMMANDS[args.command](args, rest)
    except (host.HostError, play.KubeError, OverlayError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _image(args: argparse.Namespace, rest: list[str]) -> int:
    targets = ["runtime", "dev-servers"] + (["kpi"] if args.kpi else [])
    image.build(targets, python_image=args.python_image)
    return 0


def _up(args: argparse.Namespace, rest: list[str]) -> int:
    host.prepare()
    if any(not host.image_exists(image.TARGETS[t]) for t in ("runtime", "dev-servers")):
        image.build(["runtime", "dev-servers"])
    plan = play.up(timeout=args.timeout)
    left: dict[tuple[str, str], list[str]] = {}
    for kind, name, why in plan.left_out:
        left.setdefault((kind, why), []).append(name)
    for (kind, why), names in left.items():
        print(f"  not run here: {len(names)} {kind} ({why})")
    for name, url in play.addresses(plan).items():
        print(f"  {name}: {url}")
    return _demo(plan, rest) if args.demo else 0


def _down(args: argparse.Namespace, rest: list[str]) -> int:
    play.down()
    return 0


def _status(args: argparse.Namespace, rest: list[str]) -> int:
    print(json.dumps(play.status(), indent=1, sort_keys=True))
    return 0


def _probe(args: argparse.Namespace, rest: list[str]) -> int:
    play.probe_forever()
    return 0


COMMANDS = {"image": _image, "up": _up, "down": _down, "status": _status, "probe": _probe}


if __name__ == "__main__":
    sys.exit(main())
