"""`corescale` command line. Bad input: one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from corescale.errors import UserError

EXIT_FAILED = 1
EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage dump -> our one-line contract
        raise UserError(message)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="corescale", description="Benchmark transformer inference on CPUs.")
    _common(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    run = sub.add_parser("run", help="benchmark one configuration, or sweep with -m")
    _common(run)
    run.add_argument("-m", "--multirun", action="store_true", help="sweep: comma lists / range() become trials")
    run.add_argument("--fail-fast", action="store_true", help="stop a sweep at its first failed trial")
    run.add_argument("--no-progress", action="store_true", help="no live progress display")
    run.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. batch_size=8 model=bert-tiny")

    info = sub.add_parser("info", help="this machine, as corescale sees it")
    _common(info)
    info.add_argument("--json", action="store_true")
    info.add_argument("--no-calibrate", action="store_true", help="skip the SGEMM calibration")

    show = sub.add_parser("show", help="re-print a saved result")
    _common(show)
    show.add_argument("path")
    show.add_argument("--json", action="store_true")
    return parser


def cmd_run(args) -> int:
    from corescale import sweep
    from corescale.overrides import expand_sweep

    if args.multirun:
        return sweep.run_sweep(expand_sweep(args.overrides), fail_fast=args.fail_fast,
                               progress=not args.no_progress)
    return sweep.run_single(args.overrides, progress=not args.no_progress)


def cmd_info(args) -> int:
    from corescale import environment
    from corescale.console import console

    host = environment.capture()
    if not args.no_calibrate:
        from corescale.topology import Topology

        threads = len(Topology.from_sysfs().cpu_ids)
        host["sgemm_gflops"] = {"threads": threads, "gflops": round(environment.sgemm_gflops(threads), 1)}
    if args.json:
        print(json.dumps(host, indent=2, default=str))
        return 0
    from rich.table import Table

    table = Table(title="corescale info", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    cpu = host["cpu"]
    rows = [
        ("CPU", f"{cpu['model']} ({cpu['vendor']})"),
        ("ISA", " ".join(flag for flag, present in cpu["isa"].items() if present) or "-"),
        ("topology", host["topology"]["summary"]),
        ("allowed CPUs", host["topology"]["allowed_cpus"]),
        ("cgroup CPU quota", str(host["cgroup_cpu_quota"] or "none")),
        ("memory", f"{(host['memory_bytes'] or 0) / 2**30:.1f} GiB"),
        ("kernel", host["kernel"]),
        ("governor / THP", f"{host['governor'] or 'unreadable'} / {host['transparent_hugepages'] or 'unreadable'}"),
        ("load average", " ".join(f"{x:.2f}" for x in host["load_average"])),
        ("python", host["python"]),
        ("libraries", ", ".join(f"{k} {v}" for k, v in host["libraries"].items())),
        ("env", " ".join(f"{k}={v}" for k, v in host["env"].items()) or "-"),
        ("corescale", f"{host['corescale']['version']} ({host['corescale']['commit'] or 'no git'})"),
    ]
    if "sgemm_gflops" in host:
        rows.append(("SGEMM", f"{host['sgemm_gflops']['gflops']} GFLOP/s on {host['sgemm_gflops']['threads']} threads"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return 0


def cmd_show(args) -> int:
    from corescale.console import print_result
    from corescale.results import read_result

    record = read_result(args.path)
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        print_result(record, args.path)
    return 0 if record["status"] == "ok" else EXIT_FAILED


COMMANDS = {"run": cmd_run, "info": cmd_info, "show": cmd_show}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                            format="%(levelname)s %(name)s: %(message)s")
        return COMMANDS[args.command](args)
    except UserError as exc:
        if debug:
            raise
        print(f"corescale: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("corescale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
