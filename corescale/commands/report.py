"""`corescale report ROOT -o report.html`: one self-contained HTML report plus a PNG per chart."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import add_selection, load_table

ORDER = 50


def register(sub) -> None:
    parser = sub.add_parser("report", help="self-contained HTML report (and PNGs) of a results root")
    add_common(parser)
    parser.add_argument("root", help="results root, e.g. outputs/")
    parser.add_argument("-o", "--output", help="HTML file to write (default: ROOT/report.html)")
    parser.add_argument("--machine", help="price the results on this catalog machine (default: the original "
                        "study's 48-core and 8-core figures)")
    parser.add_argument("--price-per-hour", type=float, help="$/h of the machine measured on")
    parser.add_argument("--slo-p99-ms", type=float, help="latency bound for the cheapest-layout answer")
    add_selection(parser)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from rich.markup import escape

    from corescale.report import html as report
    from corescale.report.console import console

    table = load_table(args.root, args)
    built = report.build(args.root, args.output, args.machine, args.price_per_hour, args.slo_p99_ms,
                         table=table)
    if built.missing:
        console.print(f"charts without enough data: {', '.join(built.missing)} (the report says what to run)",
                      soft_wrap=True)
    console.print(escape(f"report: {built.path}  ({len(built.charts)} charts, PNGs beside it)"), soft_wrap=True)
    return 0
