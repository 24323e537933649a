"""`corescale plan`: where each instance would run, on this machine or on one described by `lscpu -p`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from corescale.commands import add_common
from corescale.commands._common import path_arg

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

ORDER = 15


def register(sub) -> None:
    parser = sub.add_parser("plan", help="show the placement of instances on cores (no benchmark runs)")
    add_common(parser)
    parser.add_argument("--lscpu", metavar="FILE", type=path_arg,
                        help="plan for the machine whose `lscpu -p=CPU,CORE,SOCKET,NODE` output is in FILE")
    parser.add_argument("--allowed-cpus", metavar="LIST", help="only these CPUs, e.g. 0-23,48-71")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("overrides", nargs="*", help="e.g. instances=8 cores_per_instance=6 layout=latency")
    parser.set_defaults(handler=handle)


def load_topology(lscpu: str | None, allowed_cpus: str | None, cfg: BenchmarkConfig | None = None):
    """The topology to plan on; CPUs asked for with --allowed-cpus must all be usable there. This machine's
    (neither option) is what this process may use: its cpuset, and for a layout sized from the machine its
    cgroup's CPU quota (machine/cgroup.py)."""
    from corescale.errors import UserError
    from corescale.machine.cpulist import format_cpulist, parse_cpulist
    from corescale.machine.placement import topology_here
    from corescale.machine.topology import Topology, default_allowed
    from corescale.userfiles import read_text

    allowed = parse_cpulist(allowed_cpus) if allowed_cpus is not None else None
    if allowed_cpus is not None and not allowed:
        raise UserError("--allowed-cpus is empty: give a CPU list such as 0-3,8")
    if lscpu is not None:
        whole = Topology.from_lscpu(read_text(lscpu, "--lscpu file"))
    elif allowed is None and cfg is not None:
        return topology_here(cfg.use_logical_cores, sized_by_machine=cfg.cores_per_instance is None)
    else:
        whole = Topology.from_sysfs(allowed=default_allowed())
    if allowed is None:
        return whole
    missing = sorted(set(allowed) - set(whole.cpu_ids))
    if missing:
        raise UserError(f"--allowed-cpus {format_cpulist(missing)} not usable on that machine "
                        f"(usable: {format_cpulist(whole.cpu_ids)})")
    return Topology(tuple(c for c in whole.cpus if c.id in set(allowed)))


def plan_document(cfg: BenchmarkConfig, topology) -> dict:
    from corescale.machine.placement import instance_specs
    from corescale.measure.runner import check_threads, placement_for

    placement = placement_for(cfg, topology)
    check_threads(cfg, placement, topology)
    specs = instance_specs(placement, cfg.threads, cfg.instance_batch_size)
    instances = [{k: v for k, v in spec.to_json().items() if k not in ("samples_path", "peak")}
                 for spec in specs]
    return {"topology": topology.summary(), "instances": instances, "warnings": list(placement.warnings)}


def handle(args) -> int:
    from corescale.overrides import compose

    cfg = compose(args.overrides)
    document = plan_document(cfg, load_topology(args.lscpu, args.allowed_cpus, cfg))
    if args.lscpu is None:  # the instances would run here: within this cgroup's CPU quota
        from corescale.machine.cgroup import check_quota

        check_quota(sum(i["threads"] for i in document["instances"]), "the layout")
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    from corescale.report.console import console, print_note
    from corescale.report.tables import placement_table

    console.print(placement_table(document))
    for warning in document["warnings"]:
        print_note(warning, lead="warning:")
    return 0
