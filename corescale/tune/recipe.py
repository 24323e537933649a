"""What deploys the winner, written to the tune's directory: recipe.sh (N pinned copies of the user's command
with each measured instance's CPUs, memory binding and environment, or by default the `corescale run` line
that reproduces the measurement), a Python snippet building the framework session with the chosen options
(each backend's own: backends/<framework>/recipe.py),
and the chosen config as YAML. Pinning and environment are read from the winner's own record (what the
launcher really used: machine/instance_env.py), never derived again."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import yaml

from corescale.backends import attribute, entry
from corescale.errors import UserError
from corescale.machine import instance_env
from corescale.machine.cpulist import format_cpulist
from corescale.machine.preload_links import loader_safe
from corescale.overrides import override_key
from corescale.record.files import write_atomic
from corescale.record.trial import TrialRecord

RECIPE_DIR = "recipe"  # in the tune's directory
RECIPE, SNIPPET, CONFIG = "recipe.sh", "snippet.py", "config.yaml"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell takes as a variable name, and nothing else
INDEX_ENV, COUNT_ENV = "CORESCALE_INSTANCE_INDEX", "CORESCALE_INSTANCES"
LINKS = "preload_links"  # the script's variable: its private folder of links to libraries LD_PRELOAD cannot name


def run_line(overrides: list[str]) -> list[str]:
    """The `corescale run` command that measures the same config key again (results into ./outputs)."""
    kept = [o for o in overrides if override_key(o) not in ("output_dir", "repeats")]
    return [sys.executable, "-m", "corescale.cli", "run", *kept]


def serve_words(overrides: list[str]) -> list[str]:
    """endpoint=managed: the overrides `corescale serve` takes to start the service that was measured."""
    return [o for o in overrides if override_key(o) not in ("output_dir", "repeats", "endpoint", "api")]


def preloaded_links(record: TrialRecord) -> list[str]:
    """The recorded libraries whose paths LD_PRELOAD cannot name whole (a space or ':': preload_links), in order."""
    found: list[str] = []
    for report in record.instance_reports:
        value = (report.launch.get("env") or {}).get("LD_PRELOAD", "")
        found += [p for p in str(value).split(":") if p and not loader_safe(p) and p not in found]
    return found


def link_lines(linked: list[str]) -> list[str]:
    """Shell lines that link each of `linked` from a private space-free folder, removed when the script ends."""
    if not linked:
        return []
    lines = ["# ld.so splits LD_PRELOAD on spaces and colons: these libraries are preloaded through links in a",
             "# private folder, removed when this script ends",
             f"{LINKS}=$(mktemp -d /tmp/corescale-preload.XXXXXX)", f"trap 'rm -rf \"${LINKS}\"' EXIT"]
    for slot, library in enumerate(linked):
        lines.append(f"mkdir \"${LINKS}/{slot}\" && ln -s {shlex.quote(library)} "
                     f"\"${LINKS}/{slot}/\"{shlex.quote(Path(library).name)}")
    return lines


def preload_word(value: str, linked: list[str]) -> str:
    """An LD_PRELOAD value as a shell word, each linked library named by its link."""
    parts = [f"\"${LINKS}/{linked.index(p)}/\"{shlex.quote(Path(p).name)}" if p in linked else shlex.quote(p)
             for p in value.split(":") if p]
    return ":".join(parts)


def instance_lines(record: TrialRecord) -> list[str]:
    """One backgrounded line per measured instance, replayed as `Launch.from_recorded` replays it: its recorded
    variables over the inherited environment (less what an instance never inherits), then its pinning (numactl
    where it may bind memory on the machine that runs the script, else taskset), then the command."""
    linked = preloaded_links(record)
    lines = link_lines(linked)
    count = len(record.specs)
    unset = "".join(f" -u {name}" for name in instance_env.dropped_variables(record.config))
    for spec, report in zip(record.specs, record.instance_reports):
        env = checked_env(report.launch.get("env") or {}, record.trial_key)
        env.update({INDEX_ENV: str(spec.id), COUNT_ENV: str(count)})
        assigned = " ".join(f"{k}={preload_word(v, linked) if k == 'LD_PRELOAD' else shlex.quote(v)}"
                            for k, v in env.items())
        cpus, nodes = format_cpulist(spec.cpus), format_cpulist(spec.numa_nodes)
        lines.append(f"# instance {spec.id}: CPUs {cpus}, memory on NUMA node(s) {nodes or '-'}, "
                     f"{spec.threads} thread(s), batch {spec.batch_size}")
        lines.append(f"env{unset} {assigned} $(bind {shlex.quote(cpus)} {shlex.quote(nodes)}) \"$@\" &")
        lines.append("pids+=($!)")
    return lines


def checked_env(env: object, key: str) -> dict[str, str]:
    """An instance's recorded environment, safe to write into a shell line: each name a shell variable name,
    each value a string (a result file edited by hand could hold anything)."""
    if not isinstance(env, dict):
        raise UserError(f"the record of trial {key} holds an instance environment that is not a mapping")
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name) or not isinstance(value, str):
            raise UserError(f"the record of trial {key} holds an environment entry {str(name)[:40]!r}="
                            f"{str(value)[:40]!r} that is not NAME=text with NAME a shell variable name; the "
                            "recipe is not written")
    return dict(env)


def recipe_script(record: TrialRecord, overrides: list[str], summary: str) -> str:
    default = " ".join(shlex.quote(w) for w in run_line(overrides))
    head = "\n".join(f"# {line}" for line in summary.splitlines())
    return f"""#!/usr/bin/env bash
{head}
#
# usage: recipe.sh                  runs the corescale line that reproduces the measurement
#        recipe.sh -- CMD [ARG ...]  starts {len(record.specs)} copies of CMD, each pinned and configured as one
#                                    measured instance; {INDEX_ENV} (0..{len(record.specs) - 1}) and
#                                    {COUNT_ENV} tell each copy which it is
set -euo pipefail
if [ "$#" -eq 0 ]; then
  exec {default}
fi
if [ "$1" = "--" ]; then shift; fi
if [ "$#" -eq 0 ]; then echo "recipe.sh: give the command to start after --" >&2; exit 2; fi
bind() {{  # CPUS NODES -> numactl where it may bind memory here, else taskset (CPUs only)
  if [ -n "$2" ] && command -v numactl >/dev/null 2>&1 && numactl --membind="$2" true 2>/dev/null; then
    echo numactl --physcpubind="$1" --membind="$2"
  else
    echo taskset -c "$1"
  fi
}}
pids=()
trap 'kill "${{pids[@]}}" 2>/dev/null || true' INT TERM
{chr(10).join(instance_lines(record))}
status=0
for pid in "${{pids[@]}}"; do wait "$pid" || status=$?; done
exit "$status"
"""


def snippet(record: TrialRecord) -> str:
    """Python that loads the measured artifact with the chosen options (one instance): the backend's own snippet
    (its registry entry names it)."""
    cfg = record.config
    threads = record.specs[0].threads if record.specs else 1
    model = f"# the model: corescale measured {cfg.model!r} (sequence {cfg.sequence_length}, batch " \
            f"{cfg.instance_batch_size} per instance)\n"
    return attribute(entry(cfg.backend.name).snippet)(cfg, threads, model)


def write(directory: Path, record: TrialRecord, overrides: list[str], summary: str) -> dict[str, Path]:
    """recipe.sh (executable), snippet.py and config.yaml in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in ((RECIPE, recipe_script(record, overrides, summary)), (SNIPPET, snippet(record)),
                       (CONFIG, yaml.safe_dump({"overrides": [o for o in overrides if override_key(o) not in
                                                              ("output_dir", "repeats")],
                                                "config": record.config.to_dict()}, sort_keys=False))):
        paths[name] = write_atomic(directory / name, text, name)
    paths[RECIPE].chmod(0o755)
    return paths
