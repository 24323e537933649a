"""`corescale tune [words]`: search the deployment (backend, precision, layout, threads, batch, allocator,
OpenMP) for the objective under constraints; ends in a recommendation, a recipe and the report."""

from __future__ import annotations

import shlex
from contextlib import ExitStack
from typing import TYPE_CHECKING

from corescale.commands import add_common

if TYPE_CHECKING:
    from corescale.tune.document import TuneDocument

ORDER = 12
EXIT_OK, EXIT_INFEASIBLE = 0, 1


def register(sub) -> None:
    parser = sub.add_parser("tune", help="search the best deployment for an objective under constraints")
    add_common(parser)
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    parser.add_argument("overrides", nargs="*", help="objective=throughput|latency|cost, slo_p99_ms=, max_drift=, "
                        "max_memory_gb=, price_per_hour= or machine=, budget=5m or trials=N, space.NAME=[a,b], "
                        "executor=ray executor.node_type=a,b price_per_hour={a:P,b:Q} (rank node types), "
                        "and Hydra overrides (model=bert-tiny ...) that fix what is not searched")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    return run_tune(args.overrides, args)


def run_tune(words: list[str], args) -> int:
    """The tune of `words` (one per Ray node type with executor=ray: ranked by cost per 1M), its
    recommendation, report and recipe; exit 1 when nothing meets the constraints."""
    from corescale.report.console import console, print_path, print_wide
    from corescale.report.tune_console import print_shared, ranking_table
    from corescale.trials import local
    from corescale.tune import fanout, fleet
    from corescale.tune import settings as tune_settings
    from corescale.tune import study as studies

    settings = tune_settings.parse(words)
    with fleet.connected(settings) as ray, ExitStack() as held:
        tunes = fleet.plan(settings, ray)  # every type probed and checked before any trial
        for tune in tunes:  # each tune's folder ours alone, or one line naming the tune already there
            held.enter_context(studies.held(tune))
        print_shared(fleet.sharing(tunes))
        with local.interruptible():
            outcomes = fanout.search_all(tunes, lambda tune, beside: search(tune, args, beside))
            docs = [conclude(tune, outcome, args) for tune, outcome in zip(tunes, outcomes)]
    if len(tunes) > 1:
        folder = tunes[0].tune_dir.parent
        ranking = fleet.write_ranking(folder, fleet.rank([fleet.entry(tune, doc) for tune, doc in zip(tunes, docs)]))
        print_wide(ranking_table(ranking))
        print_path("node types", folder / fleet.RANKING_FILE)
        for line in ranking["headline"]:
            console.print(line, markup=False, soft_wrap=True)
    return EXIT_OK if any(doc.winner is not None for doc in docs) else EXIT_INFEASIBLE


def search(tune, args, beside: bool) -> dict:
    """The tune's measurements (Tuner.run's outcome), after its heading; beside: other node types tune at the
    same time (lines carry the node type, no live bars)."""
    from functools import partial

    from corescale.report.tune_console import TuneListener, print_heading
    from corescale.tune.search import Tuner

    prefix = f"[{tune.node_type}] " if beside else ""
    print_heading(tune, prefix)
    return Tuner(tune, partial(TuneListener, bars=not beside and not args.no_progress, prefix=prefix)).run()


def conclude(tune, outcome: dict, args) -> TuneDocument:
    """Verdict, outputs, recommendation table, report and recipe of one searched tune."""
    from corescale.report.console import console, print_path, print_wide
    from corescale.report.tune_console import recommendation_table
    from corescale.tune.outputs import used_results, write_verdict

    doc = write_verdict(tune, outcome)
    print_wide(recommendation_table(doc))
    report_path = None
    if not getattr(args, "no_report", False):  # `corescale demo` always writes it
        from corescale.report import html as report

        report_path = report.build(tune.tune_dir, tune.tune_dir / "report.html", table=used_results(tune, doc)).path
    for line in doc.headline:  # the answer, then how far the search went, what to do with it, where the report is
        console.print(line, markup=False, soft_wrap=True)
    if doc.search_end:
        console.print(f"search: {doc.search_end}", markup=False, soft_wrap=True)
    if doc.search_bounds is not None:
        console.print(doc.search_bounds.line(), markup=False, soft_wrap=True)
    if doc.spent is not None:
        console.print(doc.spent.line(), markup=False, soft_wrap=True)
    for line in doc.coverage.lines(doc.objective.unit) if doc.coverage is not None else []:
        console.print(line, markup=False, soft_wrap=True)
    if doc.recipe:
        print_path("recipe", doc.recipe["recipe.sh"])
        console.print(f"reproduce it: bash {shlex.quote(doc.recipe['recipe.sh'])}", markup=False, soft_wrap=True)
        if doc.recipe.get("bundle"):
            print_path("bundle", doc.recipe["bundle"])
            console.print(f"serve it: corescale serve {shlex.quote(doc.recipe['bundle'])}", markup=False,
                          soft_wrap=True)
        elif doc.recipe.get("serve_words"):  # a managed service whose record holds no layout: its overrides
            console.print(f"serve it: corescale serve {' '.join(map(shlex.quote, doc.recipe['serve_words']))}",
                          markup=False, soft_wrap=True)
        else:
            console.print(f"no bundle: {doc.recipe.get('bundle_skipped')}", markup=False, soft_wrap=True)
    if report_path is not None:
        print_path("report", report_path)
    return doc
