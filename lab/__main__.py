"""python -m lab up|down|status|monitor|bench [options]: see lab/README.md (bench: lab/bench.py;
monitor: lab/monitor.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from lab.core import Lab
from lab.proc import LabError
from lab.spec import DEFAULT_CACHE_DIR, DEFAULT_STATE_DIR, VLLM_KINDS, LabSpec, SpecError
from lab.stack import stack_config


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    p.add_argument("command", choices=("up", "down", "status", "stack-config", "monitor"))
    p.add_argument("--port", type=int, default=9090, help="monitor: the local port of the tunnel")
    p.add_argument("--screenshot", type=Path, default=None, help="monitor: save a PNG and exit")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--topology", choices=("bastion", "jump"), default="bastion")
    p.add_argument("--prefix", default="svl", help="short run prefix for netns/ifnames/cgroups")
    p.add_argument("--mgmt-subnet", default="10.240.1.0/24")
    p.add_argument("--fabric-subnet", default="10.241.0.0/24")
    p.add_argument("--outside-subnet", default="10.240.0.0/30")
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    p.add_argument("--fabric-ifnames", default="", help="comma-separated, one per host")
    p.add_argument("--fabric-rate", default=None, help="e.g. 1gbit: tc shaping on the fabric")
    p.add_argument("--shm-size", default="1g")
    p.add_argument(
        "--engines",
        default="",
        help="comma-separated Docker engine per host: 20.10 (default), 26, 26-containerd",
    )
    p.add_argument(
        "--vllm",
        choices=VLLM_KINDS,
        default="standin",
        help="what serves: the stand-in (default) or vLLM's CPU build (real; a ~3 GB image)",
    )
    p.add_argument("--no-image", action="store_true", help="skip building/importing the image")
    p.add_argument("--no-model", action="store_true", help="skip seeding the head's HF cache")
    return p


def spec_from(args: argparse.Namespace) -> LabSpec:
    ifnames = tuple(n for n in args.fabric_ifnames.split(",") if n)
    return LabSpec(
        hosts=args.hosts,
        topology=args.topology,
        prefix=args.prefix,
        mgmt_subnet=args.mgmt_subnet,
        fabric_subnet=args.fabric_subnet,
        outside_subnet=args.outside_subnet,
        state_dir=args.state_dir,
        cache_dir=args.cache_dir,
        fabric_ifnames=ifnames,
        fabric_rate=args.fabric_rate,
        engines=tuple(e for e in args.engines.split(",") if e),
        shm_size=args.shm_size,
        with_image=not args.no_image,
        with_model=not args.no_model,
        vllm=args.vllm,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # python -m lab bench [--short] [--out DIR]: lab/bench.py
        from lab.bench import main as bench_main

        return bench_main(argv[1:])
    args = parser().parse_args(argv)
    try:
        lab = Lab(spec_from(args))
        if args.command == "up":
            info = lab.up()
            print(info.to_json(), end="")
            print(f"lab up: ssh -F {info.ssh_config} {info.head.name}", file=sys.stderr)
        elif args.command == "stack-config":
            # For other lab shapes: python -m lab stack-config --hosts 3 > Pulumi.lab3.yaml
            print(yaml.safe_dump({"config": stack_config(lab.spec)}, sort_keys=False), end="")
        elif args.command == "monitor":
            from lab.monitor import monitor

            monitor(lab, args.port, args.screenshot)
        elif args.command == "down":
            lab.down()
            print(f"lab down: {args.state_dir}", file=sys.stderr)
        else:
            status = lab.status()
            print(json.dumps(status, indent=2))
            return 0 if status["up"] and not status["problems"] else 3
    except (LabError, SpecError) as exc:
        print(f"lab {args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
