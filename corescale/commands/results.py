"""`corescale results ROOT`: every result under a root as one table; filters; CSV export."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import add_selection, check_csv_dest, load_table, path_arg, write_csv

ORDER = 40


def register(sub) -> None:
    parser = sub.add_parser("results", help="one table of every result under a results root")
    add_common(parser)
    parser.add_argument("root", type=path_arg, help="results root, e.g. outputs/")
    add_selection(parser)
    parser.add_argument("--columns", help="comma-separated columns to show (default: a summary); 'all' for every one")
    parser.add_argument("--sort", metavar="COLUMN", help="sort by this column")
    parser.add_argument("--desc", action="store_true", help="with --sort: largest first")
    parser.add_argument("--csv", metavar="PATH", type=path_arg,
                        help="write the table (all columns) as CSV; '-' for stdout")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from corescale.analysis import store
    from corescale.errors import UserError
    from corescale.report.console import console, print_wide
    from corescale.report.tables import results_table

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
        console.print(f"{len(frame)} rows written to {args.csv}", markup=False, soft_wrap=True)
        return 0
    columns = store.summary_columns(frame) if not args.columns else (
        list(frame.columns) if args.columns == "all" else [c.strip() for c in args.columns.split(",")])
    unknown = [c for c in columns if c not in frame.columns]
    if unknown:
        raise UserError(f"unknown column(s) {', '.join(unknown)}; columns: {', '.join(frame.columns)}")
    print_wide(results_table(frame, columns, f"{len(frame)} result(s) under {args.root}"))
    return 0
