"""`corescale study cores|instances|batch [overrides]`: a scaling study (table, CSV, PNG, JSON)."""

from __future__ import annotations

from corescale.commands import add_common

ORDER = 12


def register(sub) -> None:
    from corescale.trials.studies import KINDS

    parser = sub.add_parser("study", help="scaling study: latency vs cores, throughput vs instances, batch split")
    add_common(parser)
    parser.add_argument("kind", choices=KINDS, help="cores: latency vs cores (one instance); instances: "
                        "throughput vs instances; batch: total_batch_size split over N instances")
    parser.add_argument("--values", metavar="LIST", help="the study axis (cores or instances), e.g. 1,2,4 "
                        "(default: powers of two up to the machine; batch: divisors of total_batch_size)")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failed trial")
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides; comma lists sweep, e.g. sequence_length=32,128")
    parser.set_defaults(handler=handle)


def parse_values(text: str | None) -> list[int] | None:
    from corescale.errors import UserError

    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UserError(f"--values '{text}': expected whole numbers >= 1 separated by commas, e.g. 1,2,4")
    return values


def handle(args) -> int:
    from corescale.report.console import console
    from corescale.trials.studies import rich_table, run_study

    frame, files, failures = run_study(args.kind, args.overrides, parse_values(args.values),
                                       progress=not args.no_progress, fail_fast=args.fail_fast)
    console.print(rich_table(args.kind, frame))
    for name, path in files.items():
        console.print(f"{name}: {path}")
    if failures:
        console.print(f"[red]{failures} of {len(frame)} trial(s) failed[/red]")
    return 1 if failures else 0
