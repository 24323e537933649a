"""`corescale run`: one configuration, or a Hydra `-m` sweep."""

from __future__ import annotations

from corescale.commands import add_common

ORDER = 10


def register(sub) -> None:
    parser = sub.add_parser("run", help="benchmark one configuration, or sweep with -m")
    add_common(parser)
    parser.add_argument("-m", "--multirun", action="store_true", help="sweep: comma lists / range() become trials")
    parser.add_argument("--fail-fast", action="store_true", help="stop a sweep at its first failed trial")
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.add_argument("--rerun", action="store_true",
                        help="sweep: measure every trial again, even those with a valid result already")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. batch_size=8 model=bert-tiny")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from corescale.overrides import expand_sweep
    from corescale.trials import sweep

    if args.multirun:
        return sweep.run_sweep(expand_sweep(args.overrides), fail_fast=args.fail_fast,
                               progress=not args.no_progress, resume=not args.rerun)
    return sweep.run_single(args.overrides, progress=not args.no_progress)
