"""`corescale cost ROOT [--slo-p99-ms MS]`: which machine to buy — every catalog kind ranked by US$ per 1M
inferences under the SLO, each at its cheapest measured layout (measured or projected, ranges where the ISA
differs); `--machine NAME` / `--price-per-hour P`: every layout priced on one machine."""

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
    parser = sub.add_parser("cost", help="which machine to buy: catalog kinds ranked by US$ per 1M under a p99 SLO")
    add_common(parser)
    parser.add_argument("root", nargs="?", type=path_arg, help="results root, e.g. outputs/")
    parser.add_argument("--machine", help="every layout priced on this catalog kind (see --list-machines)")
    parser.add_argument("--price-per-hour", type=positive_number, help="$/h of the machine you measured on (or, with "
                        "--machine, that machine's price)")
    parser.add_argument("--this-machine", metavar="NAME", help="the catalog kind the results were measured on "
                        "(refused when its CPU or core count differ)")
    parser.add_argument("--rank", action="store_true", help="rank the catalog even with --price-per-hour")
    parser.add_argument("--slo-p99-ms", type=positive_number, help="latency bound: p99 must be at most this many ms")
    parser.add_argument("--target-qps", type=positive_number, metavar="N",
                        help="the fleet plan: per catalog kind, the machines that carry N inferences/s under "
                        "--slo-p99-ms and their US$ per hour and month")
    parser.add_argument("--utilisation", type=positive_number, metavar="U",
                        help="with --target-qps: the share of each machine's measured rate it is planned to carry "
                        "(default 0.8: 20 %% headroom)")
    parser.add_argument("--catalog", type=path_arg, help="YAML machine catalog to use instead of the packaged one")
    parser.add_argument("--list-machines", action="store_true", help="print the machine catalog and exit")
    parser.add_argument("--csv", metavar="PATH", type=path_arg, help="write the table as CSV ('-' for stdout)")
    add_selection(parser)
    parser.set_defaults(handler=handle)


def list_machines(catalog_path) -> int:
    from corescale.analysis.catalog import load_catalog
    from corescale.report.console import print_wide
    from corescale.report.tables import catalog_table

    print_wide(catalog_table(load_catalog(catalog_path).values()))
    return 0


def handle(args) -> int:
    from corescale.analysis.catalog import find_machine, load_catalog
    from corescale.errors import UserError

    if args.list_machines:
        return list_machines(args.catalog)
    if not args.root:
        raise UserError("corescale cost: give a results root (e.g. outputs/), or --list-machines")
    check_csv_dest(args.csv)
    if args.target_qps is not None or args.utilisation is not None:
        return fleet(args)
    catalog = load_catalog(args.catalog)
    if args.this_machine:
        find_machine(args.this_machine, catalog)  # an unknown name, before any work
    if args.machine or (args.price_per_hour is not None and not args.rank):
        return one_machine(args)
    return ranked(args, catalog)


def one_machine(args) -> int:
    from corescale.analysis import cost
    from corescale.report.console import console, errors, print_note, print_wide
    from corescale.report.tables import costs_table

    machine = cost.choose_machine(args.machine, args.price_per_hour, args.catalog)
    frame = load_table(args.root, args).frame
    table = cost.cost_table(frame, machine, args.slo_p99_ms)
    if args.csv:
        write_csv(table, args.csv)
    else:
        print_wide(costs_table(table, machine))
        if not table.empty and (table["basis"] != cost.MEASURED).any():
            print_note(cost.assumption(machine, table["cpu_model"].iloc[0]), stream=console)
    (errors if args.csv == "-" else console).print(cost.answer(table, machine, args.slo_p99_ms), markup=False,
                                                   soft_wrap=True)
    return 0 if cost.cheapest(table, args.slo_p99_ms) is not None else 1


def ranked(args, catalog) -> int:
    import pandas as pd

    from corescale.analysis import pricing, ranking
    from corescale.errors import UserError
    from corescale.report.console import console, errors, print_wide
    from corescale.report.tables import cost_ranking_table

    groups = ranking.workloads(load_table(args.root, args).frame)
    if not groups:
        raise UserError(f"no valid results under '{args.root}' to price")
    tables, lines = [], []
    for workload, frame in groups:  # each checked and computed before anything is printed or written
        table = ranking.rank(frame, catalog, args.slo_p99_ms)
        here = ranking.this_machine(frame, lambda row: pricing.price_here(row, catalog, args.price_per_hour,
                                                                          args.this_machine), args.slo_p99_ms)
        tables.append(table.assign(workload=workload))
        lines.append((workload, frame, table, ranking.summary(table, here, args.slo_p99_ms)))
    if args.csv:
        write_csv(pd.concat(tables, ignore_index=True), args.csv)
    out = errors if args.csv == "-" else console
    for workload, frame, table, summary in lines:
        if not args.csv:
            print_wide(cost_ranking_table(table, args.slo_p99_ms, str(frame["cpu_model"].iloc[0]), workload))
        for line in summary:
            out.print(f"{workload}: {line}" if len(lines) > 1 else line, markup=False, soft_wrap=True)
    return 0 if any(t["rank"].notna().any() for t in tables) else 1


def fleet(args) -> int:
    """--target-qps N --slo-p99-ms S: every offered kind's fleet for the load (analysis/fleet.py); --machine NAME
    plans that kind alone."""
    import pandas as pd

    from corescale.analysis import fleet as fleets
    from corescale.analysis import ranking
    from corescale.analysis.catalog import find_machine, load_catalog
    from corescale.errors import UserError
    from corescale.report.console import console, errors, print_wide
    from corescale.report.tables import fleet_table

    if args.target_qps is None:
        raise UserError("--utilisation goes with --target-qps (the fleet plan)")
    utilisation = fleets.UTILISATION if args.utilisation is None else args.utilisation
    fleets.check_load(args.target_qps, args.slo_p99_ms, utilisation)
    if args.price_per_hour is not None or args.this_machine or args.rank:
        raise UserError("--target-qps plans catalog kinds at their list prices: leave out --price-per-hour, "
                        "--this-machine and --rank (--catalog FILE for prices of your own, --machine NAME for one)")
    catalog = load_catalog(args.catalog)
    if args.machine:
        catalog = {args.machine: find_machine(args.machine, catalog)}
    groups = ranking.workloads(load_table(args.root, args).frame)
    if not groups:
        raise UserError(f"no valid results under '{args.root}' to plan a fleet from")
    planned = [(workload, frame, fleets.fleet_plan(frame, catalog, args.target_qps, args.slo_p99_ms, utilisation))
               for workload, frame in groups]  # each computed before anything is printed or written
    if args.csv:
        write_csv(pd.concat([table.assign(workload=workload) for workload, _, table in planned], ignore_index=True),
                  args.csv)
    out = errors if args.csv == "-" else console
    for workload, frame, table in planned:
        if not args.csv:
            print_wide(fleet_table(table, args.target_qps, args.slo_p99_ms, str(frame["cpu_model"].iloc[0]),
                                   workload))
        for line in fleets.fleet_summary(table, args.target_qps, args.slo_p99_ms, utilisation):
            out.print(f"{workload}: {line}" if len(planned) > 1 else line, markup=False, soft_wrap=True)
    return 0 if any(table["machines"].notna().any() for _, _, table in planned) else 1
