"""`corescale compare BEFORE AFTER`: trials matched by config; what got faster or slower, with significance."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import add_selection, check_csv_dest, fraction_number, load_table, path_arg, write_csv

ORDER = 70


def register(sub) -> None:
    from corescale.record.stats import CHANGE_THRESHOLD as DEFAULT_THRESHOLD  # results.compare needs pandas

    parser = sub.add_parser("compare", help="compare two result roots: faster/slower, with significance")
    add_common(parser)
    parser.add_argument("before", type=path_arg, help="results root of the baseline")
    parser.add_argument("after", type=path_arg, help="results root to compare with it")
    parser.add_argument("--threshold", type=fraction_number, default=DEFAULT_THRESHOLD,
                        help=f"flag only changes larger than this fraction (default {DEFAULT_THRESHOLD:g})")
    parser.add_argument("--ignore", action="append", default=[], metavar="KEY",
                        help="config key that may differ between matched trials (repeatable), e.g. threads")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when any trial got significantly slower beyond the threshold (for CI)")
    parser.add_argument("--csv", metavar="PATH", type=path_arg, help="write the comparison as CSV ('-' for stdout)")
    add_selection(parser)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from corescale.analysis.compare import compare_frames
    from corescale.report.console import console, errors, print_wide
    from corescale.report.tables import comparison_table

    check_csv_dest(args.csv)
    result = compare_frames(load_table(args.before, args).frame, load_table(args.after, args).frame,
                            args.threshold, args.ignore)
    rows = result.rows
    if args.csv:
        write_csv(rows, args.csv)
    elif not rows.empty:
        print_wide(comparison_table(rows, f"{args.before} → {args.after} (latency p50, a QPS search's max QPS; "
                                          f"threshold {args.threshold:.0%})"))
    notes = errors if args.csv == "-" else console  # stdout holds exactly the CSV
    for side, names in (("before", result.only_before), ("after", result.only_after)):
        for name in names:
            notes.print(f"only in {side}: {name}", markup=False, soft_wrap=True)
    from corescale.analysis.compare import shared_host_note

    for line in shared_host_note(rows):
        notes.print(line, markup=False, soft_wrap=True)
    notes.print(f"{len(rows)} matched trial(s): {result.regressions} slower, {result.improvements} faster "
                f"beyond {args.threshold:.0%}; {len(rows) - result.regressions - result.improvements} unchanged "
                "or not significant", soft_wrap=True)
    if rows.empty:
        notes.print("no trials match by config (use --ignore KEY for keys that differ on purpose)")
    return 1 if args.fail_on_regression and result.regressions else 0
