"""`corescale cost ROOT --machine NAME | --price-per-hour P [--slo-p99-ms MS]`: dollars per 1M inferences."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import (
    add_selection,
    check_csv_dest,
    load_table,
    path_arg,
    positive_number,
    write_csv,
)

ORDER = 60


def register(sub) -> None:
    parser = sub.add_parser("cost", help="cost per 1M inferences; cheapest layout that meets a p99 SLO")
    add_common(parser)
    parser.add_argument("root", nargs="?", type=path_arg, help="results root, e.g. outputs/")
    parser.add_argument("--machine", help="instance type from the price catalog (see --list-machines)")
    parser.add_argument("--price-per-hour", type=positive_number, help="$/h of the machine you measured on (or, with "
                        "--machine, that machine's price)")
    parser.add_argument("--slo-p99-ms", type=positive_number, help="latency bound: p99 must be at most this many ms")
    parser.add_argument("--catalog", type=path_arg, help="YAML price catalog to use instead of the packaged one")
    parser.add_argument("--list-machines", action="store_true", help="print the price catalog and exit")
    parser.add_argument("--csv", metavar="PATH", type=path_arg, help="write the cost table as CSV ('-' for stdout)")
    add_selection(parser)
    parser.set_defaults(handler=handle)


def list_machines(catalog_path) -> int:
    from corescale.analysis.cost import load_catalog
    from corescale.report.console import print_wide
    from corescale.report.tables import catalog_table

    print_wide(catalog_table(load_catalog(catalog_path).values()))
    return 0


def handle(args) -> int:
    from corescale.analysis import cost
    from corescale.errors import UserError
    from corescale.report.console import console, errors, print_note, print_wide
    from corescale.report.tables import costs_table

    if args.list_machines:
        return list_machines(args.catalog)
    if not args.root:
        raise UserError("corescale cost: give a results root (e.g. outputs/), or --list-machines")
    check_csv_dest(args.csv)
    machine = cost.choose_machine(args.machine, args.price_per_hour, args.catalog)
    frame = load_table(args.root, args).frame
    table = cost.cost_table(frame, machine, args.slo_p99_ms)
    if args.csv:
        write_csv(table, args.csv)
    else:
        print_wide(costs_table(table, machine))
        if (table["basis"] == cost.PROJECTION).any():
            print_note(cost.assumption(machine, table["cpu_model"].iloc[0]), stream=console)
    (errors if args.csv == "-" else console).print(cost.answer(table, machine, args.slo_p99_ms), markup=False,
                                                   soft_wrap=True)
    return 0 if cost.cheapest(table, args.slo_p99_ms) is not None else 1
