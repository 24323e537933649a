"""`corescale demo [overrides]`: the default study on this machine, then the HTML report.

bert-base, sequence 128, batch 1: one instance on all cores vs one instance per core (and the instance counts
between), plus one instance on 1, 2, 4, ... cores, and the per-core instances' samples as one batch on all cores
(the batch split). Results go to outputs/demo-<stamp>/ (or OUTPUT_DIR/demo-<stamp>/
with output_dir=...). Overrides such as model=bert-tiny duration=1 apply to every trial.
"""

from __future__ import annotations

import time
from pathlib import Path

from corescale.commands import add_common
from corescale.overrides import assignment, override_key

ORDER = 5
DEFAULTS = {"model": "bert-base", "sequence_length": "128", "batch_size": "1"}
OWNED = ("instances", "cores_per_instance", "threads", "layout", "total_batch_size")


def register(sub) -> None:
    parser = sub.add_parser("demo", help="default study here (all cores vs one instance per core, core "
                                         "scaling) and its HTML report")
    add_common(parser)
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every trial, e.g. model=bert-tiny duration=1")
    parser.set_defaults(handler=handle)


def demo_trials(overrides: list[str], physical_cores: int, root: Path) -> list[list[str]]:
    """Core scaling of one instance (1, 2, 4 ... all cores) and 2 .. N one-core instances."""
    from corescale.errors import UserError
    from corescale.trials.studies import default_values

    taken = sorted({override_key(o) for o in overrides} & set(OWNED))
    if taken:
        raise UserError(f"the demo sets {', '.join(taken)} itself; remove them (use `corescale run -m` or "
                        "`corescale study` for other layouts)")
    own = [o for o in overrides if override_key(o) != "output_dir"]
    given = {override_key(o) for o in own}
    base = [f"{k}={v}" for k, v in DEFAULTS.items() if k not in given] + own + [assignment("output_dir", root)]
    counts = default_values(physical_cores)
    scaling = [[*base, "instances=1", f"cores_per_instance={c}"] for c in counts]
    per_core = [[*base, f"instances={n}", "cores_per_instance=1"] for n in counts if n > 1]
    if physical_cores == 1:
        return scaling
    # the batch split: the samples of all one-core instances together, as one batch on all cores
    batch = _batch_size(base)
    split = [*[o for o in base if override_key(o) != "batch_size"], "instances=1",
             f"cores_per_instance={physical_cores}", f"batch_size={batch * physical_cores}"]
    return scaling + per_core + [split]


def _batch_size(overrides: list[str]) -> int:
    from corescale.errors import UserError

    value = [o.split("=", 1)[1] for o in overrides if override_key(o) == "batch_size"][-1]
    try:
        return int(value)
    except ValueError:
        raise UserError(f"the demo needs one batch_size (got '{value}')") from None


def headline(root: Path, physical_cores: int) -> list[str]:
    """All cores in one instance vs one instance per core, in one line each."""
    from corescale.results import store

    frame = store.ok_rows(store.load(root, require=False).frame)
    lines = []
    if frame.empty:
        return lines
    batch = frame["batch_size"].min()
    cases = [("one instance on all cores", 1, physical_cores, batch),
             ("one instance per core", physical_cores, 1, batch),
             ("their samples as one batch on all cores", 1, physical_cores, batch * physical_cores)]
    for label, instances, cores, size in cases[:2] if physical_cores == 1 else cases:
        rows = frame[(frame["instances"] == instances) & (frame["cpus_per_instance"] == cores)
                     & (frame["batch_size"] == size)]
        if len(rows):
            row = rows.iloc[-1]
            lines.append(f"{label} ({instances} × {cores} cores, batch {size}): "
                         f"{row['throughput_samples_per_s']:.2f} samples/s, p50 {row['max_instance_p50_ms']:.1f} ms")
    return lines


def handle(args) -> int:
    from rich.markup import escape

    from corescale.commands import run
    from corescale.machine.topology import Topology
    from corescale.overrides import compose
    from corescale.report import html as report
    from corescale.report.console import console, print_path
    from corescale.results import store
    from corescale.trials.sweep import plan_sweep

    base = compose([o for o in args.overrides if override_key(o) == "output_dir"]).results_root
    root = base / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    physical = len(Topology.from_sysfs().physical_cores)
    trials = demo_trials(args.overrides, physical, root)
    console.print(f"[bold]corescale demo[/bold]: {len(trials)} trials on {physical} core(s) into {escape(str(root))}",
                  soft_wrap=True)
    args.fail_fast, args.rerun = False, False
    code = run.sweep(plan_sweep(trials), args)
    table = store.load(root, require=False)
    if store.ok_rows(table.frame).empty:
        console.print(f"[red]no trial succeeded[/red]; see {escape(str(root))}", soft_wrap=True)
        return run.EXIT_FAILED
    built = report.build(root, root / "report.html", table=table)
    for line in headline(root, physical):
        console.print(escape(line), soft_wrap=True)
    print_path("report", built.path)
    return code
