"""`corescale results ROOT`: every result under a root as one table; filters; CSV export."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import add_selection, check_csv_dest, load_table, print_wide, write_csv

ORDER = 40
HEADERS = {"batch_size": "batch", "sequence_length": "seq", "instances": "inst", "cpus_per_instance": "cpus/inst",
           "threads_per_instance": "threads/inst", "latency_p50_ms": "p50 ms", "latency_p99_ms": "p99 ms",
           "throughput_samples_per_s": "samples/s", "contaminated": "contam.", "precision": "prec."}


def register(sub) -> None:
    parser = sub.add_parser("results", help="one table of every result under a results root")
    add_common(parser)
    parser.add_argument("root", help="results root, e.g. outputs/")
    add_selection(parser)
    parser.add_argument("--columns", help="comma-separated columns to show (default: a summary); 'all' for every one")
    parser.add_argument("--sort", metavar="COLUMN", help="sort by this column")
    parser.add_argument("--desc", action="store_true", help="with --sort: largest first")
    parser.add_argument("--csv", metavar="PATH", help="write the table (all columns) as CSV; '-' for stdout")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    from corescale.analysis import store
    from corescale.errors import UserError
    from corescale.report.console import console

    check_csv_dest(args.csv)
    frame = load_table(args.root, args).frame
    if args.sort:
        if args.sort not in frame.columns:
            raise UserError(f"unknown sort column '{args.sort}'; columns: {', '.join(frame.columns)}")
        frame = frame.sort_values(args.sort, ascending=not args.desc, kind="stable")
    if args.csv:
        write_csv(frame, args.csv)
        if args.csv == "-":
            return 0
        console.print(escape(f"{len(frame)} rows written to {args.csv}"), soft_wrap=True)
        return 0
    columns = store.SUMMARY_COLUMNS if not args.columns else (
        list(frame.columns) if args.columns == "all" else [c.strip() for c in args.columns.split(",")])
    unknown = [c for c in columns if c not in frame.columns]
    if unknown:
        raise UserError(f"unknown column(s) {', '.join(unknown)}; columns: {', '.join(frame.columns)}")
    table = Table(title=escape(f"{len(frame)} result(s) under {args.root}"), header_style="bold")
    for column in columns:
        table.add_column(HEADERS.get(column, column), overflow="fold", justify="left" if column == "run" else "right")
    for _, row in frame[columns].iterrows():
        table.add_row(*(escape(store.describe_value(row[c])) for c in columns))
    print_wide(table)
    return 0
