"""A bundle opened for serving: every check before any worker starts, each failure one line (UserError).

A bundle is untrusted input: it is copied between machines and teams, and opening one must not run what its
author wrote (docs/deploy.md). The checks, in order: the manifest is there, of a known format and well formed
(serve/manifest.py: typed, every path inside the bundle, the config validated); it asks for no trust_remote_code
or pickle loading that the serve command line did not allow; this CPU has the features the bundle requires; the
backend's libraries are the measured versions (they name the artifact's build steps: another version would build
a different graph). Then the bundle is copied into the service's private work folder, each file hashed as it is
copied: a file that is not the one the manifest lists, a symbolic link, a file the manifest does not list, or a
missing one is refused, and from then on every part of the service (the front's tokenizer and head, every
worker at every restart, the runtime cache) reads the verified copy, so a bundle replaced in place meanwhile
(`rsync` over the folder) changes nothing that runs and an instance restarted later loads the same files.
Then: the instances' CPUs are allowed here; each instance's launch is derived here from its CPUs and the config,
the recorded one only checked (machine/instance_env.py Launch.from_recorded); the tokenizer loads; the
artifact's install hook (backends/options.py Artifact) files the copy where the backend's own load finds it as
built, so nothing is exported, fused or quantized again. Differences from the measuring machine (CPU model,
topology, CPU quota) are warnings, one line each.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from corescale.backends import attribute, bundled_artifact
from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.machine import instance_env
from corescale.machine.cpulist import format_cpulist
from corescale.machine.environment import HostEnvironment, cpuinfo
from corescale.machine.placement import InstanceSpec
from corescale.measure.http.contract import Layout
from corescale.record.files import read_result
from corescale.serve import bundle
from corescale.serve.manifest import (
    ARTIFACT_DIR,
    MANIFEST,
    MODEL_DIR,
    SIGNATURE,
    BundleManifest,
    manifest_text,
    read_manifest,
    write_signature,
)
from corescale.workload.heads import HeadSpec

COPY_DIR = "bundle"  # the verified copy, in the service's work folder
CACHE_DIR = "cache"  # the runtime cache (the artifact filed as built), in the work folder
COMPILED_DIR = "compiled"  # in the user's cache: the compiled models a restart imports (openvino/compiled.py)


@dataclass(frozen=True)
class Trust:
    """What the serve command line allows a bundle to ask for (--trust-remote-code, --allow-pickle): a manifest
    alone never turns either on."""

    remote_code: bool = False
    pickle: bool = False


@dataclass(frozen=True)
class Bundle:
    root: Path | None  # None: a layout from overrides (`corescale serve OVERRIDES`), no bundle
    manifest: BundleManifest | None  # None: from overrides
    model: str  # as the config names it
    head: HeadSpec
    layout: Layout  # each instance as it runs (GET /info adds the artifact each one loaded)
    cfg: BenchmarkConfig  # the serving config: model and tokenizer paths in the verified copy, cache_dir runtime
    specs: list[InstanceSpec]
    launches: list[instance_env.Launch]
    warnings: list[str] = field(default_factory=list)  # how this machine differs from the measuring one

    @property
    def tokenizer(self) -> Path:
        return Path(self.cfg.workload.tokenizer or "") / "tokenizer.json"


def part(opened: Bundle, indexes: list[int]) -> Bundle:
    """The bundle's instances at `indexes` alone (what one front of several, or one Ray replica, runs)."""
    return dataclasses.replace(opened, specs=[opened.specs[i] for i in indexes],
                               launches=[opened.launches[i] for i in indexes],
                               layout=dataclasses.replace(opened.layout,
                                                          instances=[opened.layout.instances[i] for i in indexes]))


def open_bundle(path: str | Path, work: Path, trust: Trust = Trust(), key: bytes | None = None,
                meanwhile: Callable[[], object] | None = None) -> Bundle:
    """Checks the bundle at `path` and copies it, verified, into `work` (the service's private folder, which
    also holds its runtime cache): what serves is that copy. `key`: its signature must verify with it.
    `meanwhile`: run in this thread while the copy is made in another (reading, hashing and writing release the
    GIL: the two share the CPUs); the copy's error, if any, is raised once both are done."""
    root = Path(path).expanduser()
    manifest = read_manifest(root, key)
    check_trust(root, manifest, trust)
    check_cpu(manifest)
    check_libraries(manifest)
    copy = Path(work) / COPY_DIR
    if meanwhile is None:
        verified_copy(root, manifest, copy)
    else:
        with ThreadPoolExecutor(1, thread_name_prefix="corescale-serve-copy") as copier:
            copying = copier.submit(verified_copy, root, manifest, copy)
            try:
                meanwhile()
            finally:
                copying.result()
    record = read_result(copy / bundle.RECORD)
    specs = list(record.specs)
    check_layout(root, manifest, specs)
    placed, moved = placed_here(root, specs, manifest.serving_config.use_logical_cores)
    compiled, unwritable = served_compiled_cache(manifest.serving_config.backend.name)
    cfg = runtime_config(root, copy, manifest, Path(work) / CACHE_DIR, trust, compiled)
    launches = [instance_env.Launch.from_recorded(cfg, spec, entry.to_dict(), here)
                for spec, here, entry in zip(specs, placed, manifest.layout.instances)]
    specs = placed
    if manifest.artifact is not None:
        hooks = bundled_artifact(cfg.backend.name, manifest.artifact.kind)
        attribute(str(hooks.install))(copy / ARTIFACT_DIR, manifest.artifact.steps, cfg)
    layout = bundle.layout_of(cfg, [(spec, launch.recorded()) for spec, launch in zip(specs, launches)])
    return Bundle(root, manifest, manifest.model, manifest.head_spec, layout, cfg, specs, launches,
                  moved + differences(record.environment, specs, cfg) + unwritable)


def sign_bundle(path: str | Path, key: bytes, trust: Trust = Trust()) -> Path:
    """`corescale serve BUNDLE --sign KEYFILE`: every check serve makes (in a scratch folder), then the manifest
    that was checked signed; returns the signature file."""
    from corescale.machine.scratch import scratch

    root = Path(path).expanduser()
    text = manifest_text(root)
    with scratch("sign") as work:
        open_bundle(root, work, trust)
    if manifest_text(root) != text:
        raise UserError(f"bundle '{root}': {MANIFEST} changed while it was checked; nothing signed")
    return write_signature(root, key, text)


def check_trust(root: Path, manifest: BundleManifest, trust: Trust) -> None:
    """trust_remote_code runs the model folder's Python; pickle weights can run code when loaded: a bundle may
    ask for them, only the serve command line grants them."""
    cfg = manifest.serving_config
    for asked, granted, flag in ((cfg.trust_remote_code, trust.remote_code, "--trust-remote-code"),
                                 (cfg.allow_pickle, trust.pickle, "--allow-pickle")):
        if asked and not granted:
            key = flag.removeprefix("--").replace("-", "_")
            raise UserError(f"bundle '{root}' asks for {key} (its model's files can run code when loaded): serve it "
                            f"with {flag} only if you trust who wrote it")


def verified_copy(root: Path, manifest: BundleManifest, into: Path) -> None:
    """Copies the bundle's files into `into`, hashing each as it is copied (what is verified is what serves):
    a symbolic link, a special file, a file the manifest does not list, a missing file or one whose sha256
    differs is refused (the folder is looked over first: nothing is copied from a bundle of the wrong shape)."""
    present = set()
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise UserError(f"bundle '{root}': '{relative}' is a symbolic link; a bundle holds plain files only")
            if stat.S_ISDIR(mode) or relative in (MANIFEST, SIGNATURE):
                continue
            if not stat.S_ISREG(mode):
                raise UserError(f"bundle '{root}': '{relative}' is not a plain file")
            if relative not in manifest.files:
                raise UserError(f"bundle '{root}': file '{relative}' is not listed in {MANIFEST} (a bundle holds "
                                "only the files its manifest lists with their sha256)")
            present.add(relative)
    missing = sorted(set(manifest.files) - present)
    if missing:
        raise UserError(f"bundle '{root}': file '{missing[0]}' is missing")
    for relative, digest in sorted(manifest.files.items()):
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if copy_hashed(root / relative, target) != digest:
            raise UserError(f"bundle '{root}': file '{relative}' does not match its sha256 in {MANIFEST} "
                            "(changed since it was written)")


def copy_hashed(source: Path, target: Path) -> str:
    """Copies one file (never through a link) and returns the sha256 of the bytes written."""
    digest = hashlib.sha256()
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        reason = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise UserError(f"cannot read bundle file '{source}': {reason}") from None
    with os.fdopen(fd, "rb") as reader, open(target, "xb") as writer:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise UserError(f"bundle file '{source}' is not a plain file")
        for block in iter(lambda: reader.read(1 << 20), b""):
            digest.update(block)
            writer.write(block)
    return digest.hexdigest()


def check_layout(root: Path, manifest: BundleManifest, specs: list[InstanceSpec]) -> None:
    """The manifest's layout is the record's: the same instances on the same CPUs with the same threads."""
    placed = [(s.id, list(s.cpus), list(s.numa_nodes), s.threads) for s in specs]
    listed = [(i.id, list(i.cpus), list(i.numa_nodes), i.threads) for i in manifest.layout.instances]
    if placed != listed or not specs:
        raise UserError(f"bundle '{root}': {MANIFEST}'s layout is not the one its {bundle.RECORD} measured "
                        f"({len(listed)} and {len(placed)} instance(s))")


def from_overrides(overrides: list[str]) -> Bundle:
    """`corescale serve OVERRIDES`: the layout a config asks for (from_config)."""
    from corescale.overrides import compose

    return from_config(compose(overrides))


def from_config_file(path: Path) -> Bundle:
    """`corescale serve CONFIG.json`: a config as a record holds it (what endpoint=managed starts for a trial)."""
    from corescale.config import validate
    from corescale.userfiles import read_json

    return from_config(validate(BenchmarkConfig.from_dict(read_json(path, "the config"))))


def from_config(cfg: BenchmarkConfig) -> Bundle:
    """The layout a config asks for, checked and placed as a run's trial is (`prepare_trial`), started as a run
    starts it; the artifact is built or found in cache_dir as a run's is, the compiled model in compiled_cache
    (when the config names none, where a bundle's service keeps it). Nothing here was measured: a bundle is."""
    import dataclasses

    from corescale.measure.runner import prepare_trial
    from corescale.workload.tokens import served_tokenizer

    unwritable: list[str] = []
    if cfg.compiled_cache is None:
        compiled, unwritable = served_compiled_cache(cfg.backend.name)
        cfg = dataclasses.replace(cfg, compiled_cache=str(compiled) if compiled else None)
    trial = prepare_trial(cfg)
    cfg = bundle.serving(trial.cfg)
    folder = served_tokenizer(cfg, trial.model)
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, tokenizer=str(folder)))
    specs = trial.instance_specs()
    preload = instance_env.preload_paths(cfg)
    launches = [instance_env.Launch.of(cfg, spec, preload) for spec in specs]
    launched = [(spec, launch.recorded()) for spec, launch in zip(specs, launches)]  # GET /info shows them
    return Bundle(None, None, cfg.model, trial.model.head, bundle.layout_of(cfg, launched), cfg, specs, launches,
                  unwritable)


def check_cpu(manifest: BundleManifest) -> None:
    isa = cpuinfo().isa
    missing = [f for f in manifest.requires.cpu_features if not isa.get(f)]
    if missing:
        raise UserError(f"this CPU lacks {', '.join(missing)}, which the bundle's {manifest.precision} "
                        f"graph was measured with on {manifest.measured.get('cpu') or 'its CPU'}: "
                        "measure again here")


def check_libraries(manifest: BundleManifest) -> None:
    for name, wanted in manifest.requires.libraries.items():
        try:
            have: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if wanted and have != wanted:
            raise UserError(f"the bundle was measured with {name} {wanted}, this environment has "
                            f"{have or 'none'}: install {name}=={wanted}")


def placed_here(root: Path, specs: list[InstanceSpec], logical: bool) -> tuple[list[InstanceSpec], list[str]]:
    """The instances on the CPUs this process may use (its affinity and cgroup cpuset: a container's, a
    `taskset`'s), within its cgroup's CPU quota; never outside them. The measured CPUs when they are all usable;
    else the same blocks (as many instances, as many cores each, threads as measured) placed on the usable ones
    as `corescale run` places them, with a warning line saying where (Kubernetes' static CPU manager, docker
    --cpuset-cpus and taskset choose the CPU ids, not the bundle). One line when they do not fit, or when the
    instances' busy threads exceed the quota (machine/cgroup.py), before any worker starts."""
    import dataclasses

    from corescale.machine.cgroup import check_quota
    from corescale.machine.placement import plan
    from corescale.machine.topology import Topology, default_allowed

    allowed = default_allowed()
    shape = f"its {len(specs)} instance(s) on CPUs {format_cpulist(c for s in specs for c in s.cpus)}"
    if all(set(spec.cpus) <= allowed for spec in specs):
        check_quota(sum(spec.threads for spec in specs), f"bundle '{root}' ({shape})")
        return specs, []
    topology = Topology.from_sysfs(allowed=allowed)
    smt = max(len(core) for core in topology.physical_cores)
    sizes = {len(spec.cpus) if not logical else -(-len(spec.cpus) // smt) for spec in specs}
    try:
        if len(sizes) != 1:
            raise UserError(f"its blocks are of {' and '.join(map(str, sorted(sizes)))} cores")
        placed = plan(topology, instances=len(specs), cores_per_instance=sizes.pop(), use_logical_cores=logical)
    except UserError as exc:
        raise UserError(f"bundle '{root}': {shape} do not fit the CPUs this process may use "
                        f"({format_cpulist(allowed)}: its affinity and cgroup cpuset): {exc}") from None
    moved = [dataclasses.replace(spec, placement=here, threads=min(spec.threads, len(here.cpus)))
             for spec, here in zip(specs, placed.instances)]
    check_quota(sum(spec.threads for spec in moved), f"bundle '{root}' ({shape})")
    return moved, [f"{shape} are not all among the CPUs this process may use ({format_cpulist(allowed)}: a "
                   f"container's or taskset's); placed on {', '.join(format_cpulist(m.cpus) for m in moved)}, "
                   "as many cores each", *placed.warnings]


def served_compiled_cache(backend: str) -> tuple[Path | None, list[str]]:
    """Where the instances keep what they compile (OpenVINO's blobs), across restarts: systemd's CacheDirectory=
    ($CACHE_DIRECTORY), else the user's cache ($CORESCALE_CACHE_DIR or ~/.cache/corescale), never a place the
    bundle names. None, with a warning, where it cannot be written (every start then compiles); None, silently,
    for a backend that keeps nothing compiled (its registry entry's `keeps_compiled`)."""
    from corescale.backends import entry
    from corescale.userfiles import check_writable, default_cache_dir

    if not entry(backend).keeps_compiled:
        return None, []
    root = os.environ.get("CACHE_DIRECTORY", "").split(":")[0] or default_cache_dir()
    place = Path(os.path.expanduser(root)) / COMPILED_DIR
    try:
        return check_writable(place, "the compiled-model cache", directory=True), []
    except UserError as refused:
        return None, [f"{refused}: every start compiles the model again"]


def runtime_config(root: Path, copy: Path, manifest: BundleManifest, runtime: Path, trust: Trust,
                   compiled: Path | None = None) -> BenchmarkConfig:
    """The manifest's config with its paths in the verified copy, cache_dir the runtime cache, compiled_cache this
    machine's (`compiled`, whatever the manifest says), and the tokenizer checked here (bounded, readable), not in
    the front."""
    from corescale.workload.tokens import fast_tokenizer

    cfg = manifest.serving_config
    model = str((copy / MODEL_DIR).resolve()) if cfg.model == MODEL_DIR else cfg.model  # else a preset's name
    tokenizer = copy / str(cfg.workload.tokenizer)
    if not (tokenizer / "tokenizer.json").is_file():
        raise UserError(f"bundle '{root}' has no tokenizer.json in '{cfg.workload.tokenizer}'")
    fast_tokenizer(tokenizer, cfg.sequence_length)
    return dataclasses.replace(cfg, model=model, cache_dir=str(runtime.resolve()),
                               compiled_cache=str(compiled) if compiled else None,
                               trust_remote_code=cfg.trust_remote_code and trust.remote_code,
                               allow_pickle=cfg.allow_pickle and trust.pickle,
                               workload=dataclasses.replace(cfg.workload, tokenizer=str(tokenizer.resolve())))


def differences(measured: HostEnvironment, specs: list[InstanceSpec], cfg: BenchmarkConfig) -> list[str]:
    """How this machine differs from the one the bundle was measured on, one line each: its CPU, its topology,
    the CPU quota of its cgroup (the figures in the manifest may not hold here)."""
    from corescale.machine.topology import Topology, cgroup_cpu_quota

    here = Topology.from_sysfs()
    found: list[str] = []

    def compare(what: str, there: object, now: object) -> None:
        if there is not None and there != now:
            found.append(f"{what} differs: {there} where the bundle was measured, {now} here")

    compare("the CPU", measured.cpu.model, cpuinfo().model)
    compare("the socket count", measured.topology.sockets, len(here.sockets))
    compare("the NUMA node count", measured.topology.numa_nodes, len(here.numa_nodes))
    compare("the physical core count", measured.topology.physical_cores, len(here.physical_cores))
    compare("the logical CPU count", measured.topology.logical_cpus, len(here.cpu_ids))
    quota = cgroup_cpu_quota()
    if measured.cgroup_cpu_quota != quota:
        found.append(f"the cgroup's CPU quota (docker --cpus) differs: {measured.cgroup_cpu_quota or 'none'} "
                     f"where the bundle was measured, {quota or 'none'} here")
    core_of = {cpu.id: cpu.core for cpu in here.cpus}
    node_of = {cpu.id: cpu.node for cpu in here.cpus}
    for spec in specs:
        nodes = sorted({node_of[c] for c in spec.cpus if c in node_of})
        if nodes != sorted(spec.numa_nodes):
            found.append(f"instance {spec.id}'s CPUs {format_cpulist(spec.cpus)} were on NUMA node(s) "
                         f"{format_cpulist(spec.numa_nodes)}, here on {format_cpulist(nodes) or 'none'}")
        cores = {core_of[c] for c in spec.cpus if c in core_of}
        if not cfg.use_logical_cores and len(cores) < len(spec.cpus):
            found.append(f"instance {spec.id}'s CPUs {format_cpulist(spec.cpus)} were one per physical core, here "
                         f"some are SMT siblings ({len(cores)} cores)")
    return found
