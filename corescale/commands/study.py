"""`corescale study cores|instances|batch [overrides]`: a scaling study (table, CSV, PNG, JSON)."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import add_loop_options, on_lock_wait

ORDER = 12


def register(sub) -> None:
    from corescale.config import STUDY_KINDS as KINDS  # not trials.studies: pandas takes half a second

    parser = sub.add_parser("study", help="scaling study: latency vs cores, throughput vs instances, batch split")
    add_common(parser)
    parser.add_argument("kind", choices=KINDS, help="cores: latency vs cores (one instance); instances: "
                        "throughput vs instances; batch: total_batch_size split over N instances")
    parser.add_argument("--values", metavar="LIST", help="the study axis (cores or instances), e.g. 1,2,4 "
                        "(default: powers of two up to the machine; batch: divisors of total_batch_size)")
    add_loop_options(parser)
    from corescale.commands.run import add_foreign_option

    add_foreign_option(parser)
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
    from corescale.report.console import ConsoleListener, console, errors, print_path, study_table
    from corescale.report.study import write_study
    from corescale.trials.studies import run_study

    with ConsoleListener(f"{args.kind} study", progress=not args.no_progress, tables=False) as listener:
        study = run_study(args.kind, args.overrides, parse_values(args.values), listener,
                          fail_fast=args.fail_fast, resume=not args.rerun, accept_foreign=args.accept_foreign,
                          on_lock_wait=on_lock_wait)
    files = write_study(study)
    console.print(study_table(args.kind, study.frame))
    if study.reused:
        console.print(f"{len(study.reused)} trial(s) resumed from earlier results (--rerun measures them again)")
    for name, path in files.items():
        print_path(name, path)
    if study.failures:
        errors.print(f"[red]{study.failures} of {len(study.frame)} trial(s) failed[/red]")
    return 1 if study.failures else 0
