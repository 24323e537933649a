"""`corescale tune [words]`: search the deployment (backend, precision, layout, threads, batch, allocator,
OpenMP) for the objective under constraints; ends in a recommendation, a recipe and the report."""

from __future__ import annotations

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


def listener_factory(progress_enabled: bool, prefix: str = ""):
    """prefix: before every line (the node type, when several tune side by side)."""
    from rich.markup import escape

    from corescale.report.console import ConsoleListener, SweepProgress, console

    class TuneListener(ConsoleListener):
        """One line per measurement; the bars carry the tune's stage, best so far and ETA."""

        def __init__(self, progress, reserve):
            super().__init__("trial", progress=progress_enabled, tables=False)
            self.tune_progress, self.reserve = progress, reserve

        def _where(self, item, state) -> tuple[int, str]:
            number, label = super()._where(item, state)
            return number, prefix + label

        def starting(self, item, state) -> None:
            self._close()  # on Ray, trials start side by side: the bars follow the latest
            status = self.tune_progress.text(self.reserve) if self.tune_progress else ""
            console.print(f"[bold]{escape(prefix + item.label)}[/bold]", soft_wrap=True)
            total = self.tune_progress.trials or 0 if self.tune_progress else 0
            done = self.tune_progress.done if self.tune_progress else 0
            self.bars = SweepProgress(item.trial.cfg, self.progress, min(done, total or done), total or done + 1,
                                      status).__enter__()

    return TuneListener


def handle(args) -> int:
    return run_tune(args.overrides, args)


def run_tune(words: list[str], args) -> int:
    """The tune of `words` (one per Ray node type with executor=ray: ranked by cost per 1M), its
    recommendation, report and recipe; exit 1 when nothing meets the constraints."""
    from corescale.trials import local
    from corescale.tune import fleet
    from corescale.tune import settings as tune_settings

    settings = tune_settings.parse(words)
    with fleet.connected(settings) as ray:
        tunes = fleet.plan(settings, ray)  # every type probed and checked before any trial
        with local.interruptible():
            outcomes = side_by_side(tunes, args) if together(tunes) else [search(tune, args) for tune in tunes]
            docs = [conclude(tune, outcome, args) for tune, outcome in zip(tunes, outcomes)]
    if len(tunes) > 1:
        ranking = fleet.write_ranking(tunes[0].tune_dir.parent, fleet.rank(
            [fleet.entry(tune, doc) for tune, doc in zip(tunes, docs)]))
        print_ranking(ranking, tunes[0].tune_dir.parent / fleet.RANKING_FILE)
    return EXIT_OK if any(doc.winner is not None for doc in docs) else EXIT_INFEASIBLE


def together(tunes) -> bool:
    """Several node types on separate CPUs tune at once; types sharing a host's CPUs, one after the other."""
    from rich.markup import escape

    from corescale.report.console import errors
    from corescale.tune import fleet

    if len(tunes) < 2:
        return False
    shared = fleet.sharing(tunes)
    for a, b in shared:
        errors.print(escape(f"note: node types {a} and {b} have nodes on the same CPUs of one host: tuned one "
                            "after the other"), soft_wrap=True)
    return not shared


def side_by_side(tunes, args) -> list[dict]:
    """The node types' searches at once, one thread each (each on its own nodes; Ray's driver API is
    thread-safe): the fleet takes as long as its slowest type, not their sum. Lines carry the node type; live
    bars are off (one display at a time). The first error is raised once every search has ended."""
    import threading

    outcomes: list = [None] * len(tunes)
    failures: list[BaseException] = []

    def work(i: int, tune) -> None:
        try:
            outcomes[i] = search(tune, args, progress=False, prefix=f"[{tune.node_type}] ")
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i, tune), name=f"tune-{tune.node_type}", daemon=True)
               for i, tune in enumerate(tunes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # short joins: Ctrl-C and SIGTERM reach the main thread meanwhile
    if failures:
        raise failures[0]
    return outcomes


def search(tune, args, progress: bool | None = None, prefix: str = "") -> dict:
    """The tune's measurements (Tuner.run's outcome), after its heading."""
    from rich.markup import escape

    from corescale.report.console import console, errors, print_path
    from corescale.tune.engine import Tuner

    settings = tune.settings
    where = f" on node type {tune.node_type} ({tune.nodes} node(s), {tune.physical_cores} cores each)" \
        if tune.on_ray else ""
    console.print(f"[bold]corescale tune[/bold]{escape(where)}: objective {settings.objective.name}, "
                  f"{tune.space.size()} configurations in the space, screening {tune.screen_s:g} s / full "
                  f"{tune.cfg.duration:g} s windows", soft_wrap=True)
    print_path("tune", tune.tune_dir)
    for note in tune.space.notes:
        errors.print(f"{escape(prefix)}note: {escape(note)}", soft_wrap=True)
    enabled = not args.no_progress if progress is None else progress
    return Tuner(tune, listener_factory(enabled, prefix)).run()


def conclude(tune, outcome: dict, args) -> TuneDocument:
    """Verdict, outputs, recommendation table, report and recipe of one searched tune."""
    from rich.markup import escape

    from corescale.report.console import console, print_path
    from corescale.tune.outputs import write_outputs
    from corescale.tune.verdict import decide

    settings = tune.settings
    finalists = outcome["finalists"]
    baseline = next((f for f in finalists if f.baseline), None)
    verdict = decide([f for f in finalists if not f.baseline], baseline, settings.objective, settings)
    doc = write_outputs(tune, outcome["study"], verdict, finalists)
    print_recommendation(doc)
    if not getattr(args, "no_report", False):
        from corescale.report import html as report

        built = report.build(tune.tune_dir, tune.tune_dir / "report.html", table=used_results(tune, doc))
        print_path("report", built.path)
    if doc.recipe:
        print_path("recipe", doc.recipe["recipe.sh"])
    for line in doc.headline:
        console.print(escape(line), soft_wrap=True)
    return doc


def print_ranking(ranking: dict, path) -> None:
    from rich.markup import escape
    from rich.table import Table

    from corescale.commands._common import print_wide
    from corescale.report.console import console, print_path

    table = Table(title="tune: node types by cost per 1M inferences (each at its recommended deployment)",
                  header_style="bold")
    for column in ("rank", "node type", "nodes", "cores", "US$/h", "recommended", "samples/s", "p99 ms",
                   "US$/1M", "× cheapest"):
        table.add_column(column, justify="left" if column in ("node type", "recommended") else "right")

    def num(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}"

    for e in ranking["node_types"]:
        table.add_row(str(e["rank"]), escape(str(e["node_type"])), str(e["nodes"]), str(e["physical_cores"]),
                      num(e["price_per_hour"], 3), escape(e["winner"] or "none feasible"), num(e["throughput"]),
                      num(e["p99_ms"]), num(e["cost_per_1m"], 4), num(e["vs_cheapest"]))
    print_wide(table)
    print_path("node types", path)
    for line in ranking["headline"]:
        console.print(escape(line), soft_wrap=True)


def used_results(tune, doc: TuneDocument):
    """The results this tune used, wherever they were measured (earlier tunes and runs under the same
    output_dir are resumed by key): the report's table."""
    from pathlib import Path

    from corescale.analysis import store

    used = {str(Path(p).resolve()) for p in doc.result_paths()}
    table = store.load(tune.cfg.results_root, latest=False)
    keep = table.frame["path"].map(lambda p: str(Path(p).resolve()) in used)
    return store.Table(table.frame[keep].reset_index(drop=True), table.problems, table.unfinished)


def print_recommendation(doc: TuneDocument) -> None:
    from rich.markup import escape
    from rich.table import Table

    from corescale.commands._common import print_wide

    table = Table(title="tune: recommendation (means over repeats, 95 % CI)", header_style="bold")
    for column in ("", "configuration", "samples/s", "95 % CI", "p50 ms", "p99 ms", "US$/1M", "drift",
                   "memory GB", "meets"):
        table.add_column(column, justify="left" if column in ("", "configuration") else "right")

    for f in doc.rows:
        table.add_row(f.role, escape(f.label), f.throughput.text(), f.throughput.interval_text(), f.p50_ms.text(),
                      f.p99_ms.text(), f.cost_per_1m.text(4), f.drift.text(3), f.memory_gb.text(),
                      "yes" if f.feasible else "no")
    print_wide(table)
