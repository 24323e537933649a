"""The package's shape: stages as packages, the only top-level modules, no import cycle, data flowing one way."""

import ast
import dataclasses
import functools
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "corescale"
TOP_LEVEL = {"__init__.py", "__main__.py", "cli.py", "errors.py", "typed.py", "userfiles.py", "bounds.py",
             "http_keys.py", "config_server.py", "config.py", "overrides.py"}
# each stage may import the ones before it, never one after it (commands and cli sit on top)
ORDER = ["errors", "typed", "userfiles", "bounds", "workload.tasks", "http_keys", "machine", "backends.options",
         "config_server", "config", "overrides", "workload", "record", "measure", "backends", "trials", "analysis",
         "serve", "deploy", "embed", "explain", "tune", "report", "commands", "cli", "__main__"]


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every rule here (each read the whole package again: ~190 files)."""
    return ast.parse(path.read_text())


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(_tree(path)))


@functools.cache
def imports() -> dict[str, set[str]]:
    """module -> corescale modules it imports (module level and inside functions)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        for node in _nodes(path):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("corescale"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("corescale"))
        graph[name] = found
    return {m: {i for i in targets if i in graph} for m, targets in graph.items()}


def stage(module: str) -> int:
    parts = module.split(".")[1:]
    for length in (2, 1):
        name = ".".join(parts[:length])
        if name in ORDER:
            return ORDER.index(name)
    if parts[:1] == ["backends"] and parts[-1] == "options":
        return ORDER.index("backends.options")
    return -1  # corescale/__init__


def test_only_the_listed_top_level_modules():
    assert {p.name for p in PACKAGE.glob("*.py")} <= TOP_LEVEL
    stages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert stages == {"workload", "machine", "record", "measure", "backends", "trials", "analysis", "serve", "deploy",
                      "embed", "explain", "tune", "report", "commands"}


def test_no_import_cycle():
    graph = imports()
    state: dict[str, int] = {}

    def visit(module, path):
        state[module] = 1
        for target in graph[module]:
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, module, target]))
            if state.get(target) is None:
                visit(target, [*path, module])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


def test_data_flows_one_way():
    """No module imports a later stage, except the light backend registry read by the config and the worker
    entry points, which import what they run (backends by name through the registry)."""
    upward = []
    for module, targets in imports().items():
        for target in targets:
            if stage(target) > stage(module) and not _allowed(module, target):
                upward.append(f"{module} -> {target}")
    assert upward == []


def _allowed(module: str, target: str) -> bool:
    """The light registry (names, facts, option classes; no framework import) is data every stage from the machine
    on may read: the machine's environment records every registered backend's libraries, the config holds the
    options as its `backend` group."""
    registry = target in ("corescale.backends",) or target.endswith(".options")
    return registry and stage(module) >= ORDER.index("machine")


def _imported_names(path: Path) -> set[str]:
    """Every module a file imports (module level and inside functions), corescale's or not."""
    names = set()
    for node in _nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_commands_parse_stage_and_render():
    """A command parses, stages (a function of a stage below) and renders (report/): it imports neither rich
    (tables and markup are built in report/) nor threading (fan-outs live with their feature), and defines no
    class (listeners live in report/)."""
    found = {}
    for path in (PACKAGE / "commands").glob("*.py"):
        banned = sorted(n for n in _imported_names(path) if n.split(".")[0] in ("rich", "threading"))
        classes = [node.name for node in _nodes(path) if isinstance(node, ast.ClassDef)]
        if banned or classes:
            found[path.name] = banned + classes
    assert found == {}


MAX_LINES = 500  # tune/engine.py grew to 564 (plan, study, ETA, search in one) before it was split


def test_no_module_is_a_whole_feature():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_errors_holds_only_errors():
    """errors.py is the first stage because it holds only exception types (file helpers: userfiles.py)."""
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    others = [getattr(node, "name", type(node).__name__) for node in tree.body
              if not isinstance(node, (ast.ClassDef, ast.ImportFrom, ast.Import))
              and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    assert others == []


RETIRED_NAMES = ("measure", "_measure", "Measured", "measured", "describe", "ms", "_ms")


def test_one_meaning_per_name():
    """Names that meant several things before issue 19: `measure` is only the package now; `describe`, `measured`
    and `Measured` are defined nowhere (each got a name that says what it gives); `ms` once: seconds ->
    milliseconds (record/stats.py; report/console.ms_text formats it)."""
    defined = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        for node in _nodes(path):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in RETIRED_NAMES:
                defined[node.name].append(str(path.relative_to(PACKAGE)))
    assert dict(defined) == {"ms": ["record/stats.py"]}


def test_instances_is_only_the_count_on_the_record():
    """The config's `instances` is how many; the workers' reports and the per-instance metrics say what they are."""
    from corescale.record.trial import RunMetrics, TrialRecord

    assert [cls.__name__ for cls in (TrialRecord, RunMetrics)
            if "instances" in {f.name for f in dataclasses.fields(cls)}] == []



PRECISION_NAMES = ("fp32", "bf16", "int8", "fp16")  # the registered ones, and the toy's (tests/toy_precision)
# modules where a word of PRECISION_NAMES names something else: the words, and what they mean there
OTHER_MEANINGS = {"machine/environment.py": ({"bf16"}, "aarch64's CPU flag"),
                  "analysis/catalog.py": ({"bf16"}, "aarch64's ISA name"),
                  "machine/peak.py": ({"bf16"}, "OpenVINO's element type"),
                  "workload/modelfile.py": ({"fp32", "bf16", "int8", "fp16"}, "ONNX and OpenVINO element types"),
                  "embed/columns.py": ({"int8"}, "a written vector's type (sentence-transformers' name)"),
                  "commands/embed.py": ({"int8"}, "--dtype: a written vector's type")}


def _literal_precisions(path: Path) -> set[str]:
    """The precision names written as string literals in a module (docstrings aside)."""
    docstrings = {id(node.body[0].value) for node in _nodes(path)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr)}
    return {node.value for node in _nodes(path) if isinstance(node, ast.Constant)
            and node.value in PRECISION_NAMES and id(node) not in docstrings}


def test_no_precision_is_named_outside_its_registry():
    """Every fact of a precision is its entry in machine/precisions.py: no other module compares a precision to a
    literal name or keeps a table keyed by one (issue 35: a new precision then needs no edit elsewhere). A backend
    computes in its own precisions (backends/<framework>/, and the int8 options' base in backends/options.py); the
    default, reference precision is precisions.REFERENCE."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "machine/precisions.py" or name.startswith("backends/") and name != "backends/__init__.py":
            continue
        words = _literal_precisions(path) - OTHER_MEANINGS.get(name, (set(), ""))[0]
        if words:
            found[name] = sorted(words)
    assert found == {}


# names every module of its package defines on purpose: the interface that package's modules share
SHARED_NAMES = {
    "main": "a module run as `python -m` (measure/worker.py, forkserver.py, calibrate.py) has its own entry point",
    "register": "each command module adds its subcommand's arguments (commands/__init__.py calls them all)",
    "handle": "each command module runs its subcommand (commands/__init__.py dispatches to them)",
}


def test_no_two_top_level_definitions_of_a_package_share_a_name():
    """Within one package a name means one thing (0.3 had two `Server`s in measure/, two `serving_config`s in
    serve/ giving different results); a module's private helpers (`_name`) are its own."""
    defined = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        for node in _tree(path).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    not node.name.startswith("_") and node.name not in SHARED_NAMES:
                defined[(str(path.parent.relative_to(PACKAGE)), node.name)].append(path.name)
    assert {key: files for key, files in defined.items() if len(files) > 1} == {}


def test_no_module_but_the_task_registry_names_a_task_in_a_branch_or_a_table():
    """Tasks are entries (workload/tasks.py): no other module compares a task to a literal name (`== "rerank"`,
    `in ("rerank", "classify")`) or keeps a dict keyed by task names; it reads the entry's facts."""
    from corescale.workload.tasks import TASKS

    def named(node: ast.AST) -> list[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [n.value for n in items if isinstance(n, ast.Constant) and n.value in TASKS]

    found = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "workload" / "tasks.py":
            continue
        for node in _nodes(path):
            if isinstance(node, ast.Compare):
                names = [name for side in (node.left, *node.comparators) for name in named(side)]
            elif isinstance(node, ast.Dict):
                names = [name for key in node.keys if key is not None for name in named(key)]
            else:
                continue
            if names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {', '.join(names)}")
    assert found == []


HTTP_CLIENTS = ("httpx", "aiohttp", "urllib.request", "http.client", "requests")


def test_http_measurement_lives_in_its_own_package():
    """Measuring a server over HTTP is measure/http/ (issue 35): no other module of measure/ sends a request or is
    named for HTTP, and measure/http/ imports nothing that starts a local instance (its trial starts none: a managed
    service is `corescale serve`'s own)."""
    measure = PACKAGE / "measure"
    outside = {p.name: sorted(n for n in _imported_names(p) if n in HTTP_CLIENTS or n.split(".")[0] in HTTP_CLIENTS)
               for p in measure.glob("*.py")}
    assert {name: clients for name, clients in outside.items() if clients} == {}
    assert [p.name for p in measure.glob("*.py") if "http" in p.stem or "endpoint" in p.stem] == []
    local = ("corescale.measure.launcher", "corescale.measure.instance", "corescale.measure.forkserver",
             "corescale.measure.worker")
    starts = {p.name: sorted(n for n in _imported_names(p) if n in local) for p in (measure / "http").glob("*.py")}
    assert {name: found for name, found in starts.items() if found} == {}


def test_only_serve_is_named_for_the_service():
    """`corescale serve` is serve/ (and its command); measure/server.py (LoadGen's scenarios) read as the service and
    is measure/loadgen.py since issue 35: no other module is named `serve*` or `server*`."""
    named = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.stem.startswith("serve")
             and p.relative_to(PACKAGE).parts[0] not in ("serve", "commands")]
    assert named == []


def test_every_config_parameter_is_typed():
    """`cfg` is annotated at every parameter (issue 35: 32 of 119 were): as `BenchmarkConfig`, or below the config
    as the Protocol of what that stage reads of it (machine/instance_env.LaunchSettings, backends/options.py's)."""
    bare = []
    for path in PACKAGE.rglob("*.py"):
        for node in _nodes(path):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                bare += [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}({a.arg})"
                         for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
                         if "cfg" in a.arg and a.annotation is None]
    assert bare == []
