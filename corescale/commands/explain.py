"""`corescale explain`: where one configuration's time goes, how far its GEMMs are from the machine's peak, and
what to change. Profiles with the framework's own profiler in a pinned worker (never a timing result)."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands._common import on_lock_wait

ORDER = 15


def register(sub) -> None:
    parser = sub.add_parser("explain", help="profile one configuration: time by op class, GEMM efficiency, findings")
    add_common(parser)
    parser.add_argument("--compare", metavar="KEY=A,B", help="explain one configuration per value side by side, "
                        "e.g. backend=pytorch,openvino or backend.linear=default,onednn")
    parser.add_argument("--op-class", metavar="LIST", help="list every op of these classes (comma separated): "
                        "gemm, attention, norm_activation, embedding, data_movement, other, overhead")
    parser.add_argument("--json", action="store_true", help="print the saved JSON's path only (machine-readable)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=bert-base batch_size=8")
    parser.set_defaults(handler=handle)


def configurations(args) -> list[list[str]]:
    """The overrides of each configuration explained."""
    from corescale.errors import UserError

    if not args.compare:
        return [args.overrides]
    key, sep, values = args.compare.partition("=")
    choices = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or len(choices) < 2:
        raise UserError(f"--compare needs KEY=A,B (two or more values), e.g. backend=pytorch,openvino "
                        f"(got '{args.compare}')")
    if any(o.split("=", 1)[0] == key for o in args.overrides):
        raise UserError(f"--compare {key}=... and the override {key}= both set {key}: give it once")
    return [[*args.overrides, f"{key}={value}"] for value in choices]


def prepare(overrides: list[str]):
    from corescale.errors import UserError
    from corescale.explain.profilers import check_profiler
    from corescale.measure.runner import check_stated_precision, prepare_trial
    from corescale.overrides import compose

    cfg = compose(overrides)
    check_profiler(cfg.backend.name)
    if cfg.instances != 1 or cfg.layout != "none":
        raise UserError(f"explain profiles one instance (got instances={cfg.instances}, layout={cfg.layout}); "
                        "profile one instance of the placement you want to understand")
    trial = prepare_trial(cfg)
    check_stated_precision(trial, overrides)
    return trial


def handle(args) -> int:
    from corescale.explain import analysis
    from corescale.explain.opclasses import check_filter
    from corescale.explain.run import profile
    from corescale.machine import environment
    from corescale.record.files import write_atomic
    from corescale.report import explain as draw
    from corescale.report.console import console, errors, print_path, print_wide
    from corescale.trials.local import interruptible

    classes = check_filter([c.strip() for c in args.op_class.split(",") if c.strip()]) if args.op_class else ()
    trials = [prepare(overrides) for overrides in configurations(args)]  # every check before any process starts
    host = environment.capture()
    results = []
    with interruptible():  # SIGTERM/SIGHUP stop it like Ctrl-C: the worker and the temp directory go
        for trial in trials:
            errors.print(f"profiling {analysis.label(trial.cfg)} ...", markup=False)
            raw = profile(trial, host.cpu.isa, on_lock_wait)
            results.append(analysis.explain(raw, trial.cfg, trial.model))
    path = analysis.save(results, trials[0].cfg.results_root)
    png = write_atomic(path.with_suffix(".png"), draw.figure_png(results), "figure")
    if args.json:
        print(path)
        return 0
    print_wide(draw.classes_table(results))
    for result in results:
        print_wide(draw.ops_table(result, classes))
        console.print(f"findings for {result['label']}:", markup=False)
        for line in draw.findings_lines(result):
            console.print(line, markup=False, soft_wrap=True)
    print_path("explain", str(path))
    print_path("figure", str(png))
    return 0
