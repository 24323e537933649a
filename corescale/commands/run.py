"""`corescale run`: one configuration, or a Hydra `-m` sweep."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import add_loop_options, on_lock_wait

ORDER = 10


def register(sub) -> None:
    parser = sub.add_parser("run", help="benchmark one configuration, or sweep with -m")
    add_common(parser)
    parser.add_argument("-m", "--multirun", action="store_true", help="sweep: comma lists / range() become trials")
    add_loop_options(parser, "trial of a sweep")
    add_foreign_option(parser)
    parser.add_argument("--bundle", metavar="DIR", help="write a deployment bundle of the result to DIR (a new "
                        "folder), for `corescale serve DIR`")
    parser.add_argument("--sign", metavar="KEYFILE", help="sign the bundle with the key in KEYFILE (HMAC-SHA256 of "
                        "its manifest; `corescale serve DIR --verify KEYFILE` checks it)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. batch_size=8 model=bert-tiny")
    parser.set_defaults(handler=handle)


EXIT_OK, EXIT_FAILED = 0, 1


def add_foreign_option(parser) -> None:
    parser.add_argument("--accept-foreign", action="store_true",
                        help="resume from results measured on another machine or with other library versions too "
                             "(by default only this machine + software's results count)")


def handle(args) -> int:
    from corescale.overrides import expand_sweep
    from corescale.trials.sweep import plan_sweep

    planned = plan_sweep(expand_sweep(args.overrides) if args.multirun else [args.overrides])
    check_cost([item.trial.cfg.cost for item in planned])
    if args.bundle:
        from corescale.errors import UserError
        from corescale.serve.bundle import check_destination

        if args.multirun:
            raise UserError("--bundle takes one configuration, not a sweep (-m)")
        check_destination(args.bundle, planned[0].trial.cfg)  # before any worker starts
    if args.sign:
        from corescale.errors import UserError
        from corescale.serve.manifest import read_key

        if not args.bundle:
            raise UserError("--sign signs a bundle: give --bundle DIR too")
        args.key = read_key(args.sign)  # before any worker starts
    if args.multirun:
        return sweep(planned, args)
    return single(planned, args)


def check_cost(settings: list) -> None:
    """The `cost.*` keys (a catalog kind said to be this machine must be it), before any worker starts."""
    from corescale.analysis.pricing import check_settings
    from corescale.machine.environment import cpuinfo
    from corescale.machine.topology import Topology

    if not any(s.machine or s.catalog for s in settings):
        return
    cpu, cores = cpuinfo().model, len(Topology.from_sysfs().physical_cores)
    for one in {(s.price_per_hour, s.machine, s.catalog): s for s in settings}.values():
        check_settings(one, cpu, cores)


def single(planned, args) -> int:
    """One configuration: measured again every time; bad input inside an instance is exit 2."""
    from corescale.report.console import ConsoleListener, print_repeats
    from corescale.trials.sweep import run_sweep

    repeats = planned[0].trial.cfg.repeats
    with ConsoleListener("run", progress=not args.no_progress, tables=repeats == 1) as listener:
        state = run_sweep(planned, listener, resume=False, keep_going=False, on_lock_wait=on_lock_wait)
    if repeats > 1:
        print_repeats(state, planned)
    if args.bundle and not state.failed:
        from corescale.report.console import print_path
        from corescale.serve.bundle import write

        print_path("bundle", write(args.bundle, next(r.result() for r in state.rows if r.status == "ok"),
                                   key=getattr(args, "key", None)))
    return EXIT_FAILED if state.failed else EXIT_OK


def sweep(planned, args, **listener_options) -> int:
    """A grid: resumed by key, failed trials recorded, a summary table at the end."""

    from corescale.report.console import (
        ConsoleListener,
        console,
        errors,
        loop_summary,
        loop_table,
        print_path,
        print_repeats,
    )
    from corescale.trials.sweep import run_sweep

    options = {"progress": not args.no_progress, "tables": not args.no_progress, **listener_options}
    with ConsoleListener("trial", **options) as listener:
        state = run_sweep(planned, listener, fail_fast=args.fail_fast, resume=not args.rerun,
                          on_lock_wait=on_lock_wait, accept_foreign=getattr(args, "accept_foreign", False))
    if state.stopped:
        errors.print("stopped the sweep at its first failed trial (--fail-fast)")
    console.print(loop_table(state))
    console.print(loop_summary(state))
    if any(item.trial.cfg.repeats > 1 for item in planned):
        print_repeats(state, planned)
    for root in sorted({str(item.root) for item in planned}):
        print_path("results", root)  # the path alone on its line; the hint on the next
    console.print("(corescale results ROOT shows them as one table)")
    return EXIT_FAILED if state.failed else EXIT_OK
