"""`corescale report ROOT -o report.html`: one self-contained HTML report plus a PNG per chart."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import add_selection, load_table, path_arg, positive_number

ORDER = 50


def register(sub) -> None:
    parser = sub.add_parser("report", help="self-contained HTML report (and PNGs) of a results root")
    add_common(parser)
    parser.add_argument("root", type=path_arg, help="results root, e.g. outputs/")
    parser.add_argument("-o", "--output", type=path_arg, help="HTML file to write (default: ROOT/report.html)")
    parser.add_argument("--machine", help="price the results on this catalog machine (default: the original "
                        "study's 48-core and 8-core figures)")
    parser.add_argument("--price-per-hour", type=positive_number, help="$/h of the machine measured on")
    parser.add_argument("--slo-p99-ms", type=positive_number, help="latency bound for the cheapest-layout answer")
    add_selection(parser)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from pathlib import Path

    from corescale.report import html as report
    from corescale.report.console import console, print_note, print_path
    from corescale.userfiles import check_writable

    table = load_table(args.root, args)
    check_writable(args.output or Path(args.root) / "report.html", "report", parents=True)  # before any work
    report.cost_machines(args.machine, args.price_per_hour)  # an unknown --machine, before any work
    built = report.build(args.root, args.output, args.machine, args.price_per_hour, args.slo_p99_ms,
                         table=table)
    for reason in built.skipped:
        print_note(reason, lead="skipped:")
    if built.missing:
        console.print(f"charts without enough data: {', '.join(built.missing)} (the report says what to run)",
                      soft_wrap=True)
    console.print(f"{len(built.charts)} charts, a PNG of each beside the report")
    print_path("report", built.path)
    return 0
