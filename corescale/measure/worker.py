"""One instance: pinned process that loads a backend, warms up with its siblings, starts with them, measures.

Run as `python -m corescale.measure.worker JOB.json` by the launcher. Protocol with the parent:
- its messages (measure/protocol.py, one JSON line each) go to the original stdout; library noise to stderr;
- `loaded` -> the parent writes `warmup` once EVERY instance is loaded, so warm-up runs under the load the window
  will see -> `ready` (stable, or not: `converged`) -> the instance keeps calling the model (still warm-up) until
  the parent writes `start <perf_counter_ns>` once every instance is ready -> the timed window from that instant.
  End of input (or any other command) at any point ends the instance.
- serving (scenario=server|single_stream): from the start instant the instance waits for `batch N I,J,...` lines
  (query indices into the trial's query set), answers each with a `served` line, and ends at `stop` with its
  `result`. `corescale serve` sends `infer N IDS;IDS;...` instead (each row's token ids, commas between ids,
  semicolons between rows; `IDS/TYPES` for a pair's token type ids) and gets an `answered` line holding the
  output rows (the task's output: the head is in the measured call), or an `unanswered` line when that batch
  could not be computed (the instance serves on). Such a worker ignores SIGTERM: it ends on `stop` or end of
  input, so a signal to every process of the service (systemd's control group) leaves the drain to the parent.
The parent's lines are protocol.py's commands (`say` writes them, `heard` reads them here).
"""

from __future__ import annotations

import gc
import os
import resource
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, TypeVar

from corescale.measure import imports, protocol
from corescale.measure.warm_calls import real_calls, warm_shapes

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

Expected = TypeVar("Expected", protocol.Warmup, protocol.Start)

# No framework imports at module level: affinity and threads are set before any framework loads.


class Control:
    def __init__(self) -> None:
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # frameworks that print to stdout must not corrupt the control channel

    def send(self, message: protocol.Message) -> None:
        self.out.write(protocol.encode(message))

    def wait_for(self, kind: type[Expected]) -> Expected | None:
        """Blocks for the parent's next command; it when it is of `kind`, None on any other or end of input."""
        command = self.next()
        return command if isinstance(command, kind) else None

    def next(self) -> protocol.Command | None:
        return protocol.heard(sys.stdin.readline())

    def pending(self) -> bool:
        return bool(select.select([sys.stdin], [], [], 0)[0])


def keep_warm(call, control: Control, durations: list[int]) -> int | None:
    """Calls the model until the start instant arrives, then stops early enough to be idle at that instant.
    Returns the start instant (None on abort); the extra calls are warm-up, appended to `durations`."""
    start_ns = None
    while True:
        if start_ns is None and control.pending():
            start = control.wait_for(protocol.Start)
            if start is None:
                return None
            start_ns = start.ns
        last = durations[-1] if durations else 0
        if start_ns is not None and time.perf_counter_ns() + 2 * last >= start_ns:
            return start_ns
        began = time.perf_counter_ns()
        call()
        durations.append(time.perf_counter_ns() - began)


def reset_peak_rss() -> bool:
    """Linux: make VmHWM start again from the current RSS (so the load stage's peak is not counted)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def memory_now() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    found = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024
    return found


def process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Instance:
    """One instance's life, as pyperf's WorkerTask: load, warm up, then the closed loop or serving."""

    def __init__(self, job_path: str, control: Control) -> None:
        self.imported = imports.timed_imports(list(imports.JOB_MODULES))
        job = protocol.Job.read(job_path)
        self.files, self.control = job.files, control
        self.cfg, self.spec, self.model, self.trial_cpus = job.config, job.instance, job.model, job.trial_cpus
        os.sched_setaffinity(0, list(self.spec.cpus))  # before any framework creates its thread pool
        self.serving = self.cfg.scenario != "offline"
        self.service = self.serving and job.files.queries is None  # corescale serve's (no query set, no window)
        if self.service:  # it ends on `stop` or end of input,
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # so a SIGTERM to every process of the service drains
        self.tokens = TokenCount()
        self.checked: dict | None = None  # a served trial's instance 0: its quality, checked before serving

    def run(self) -> None:
        self.load()
        start_ns = self.warm()
        if start_ns is None:
            return
        if self.serving:
            self.serve()
        else:
            self.closed_loop(start_ns)

    def load(self) -> None:
        """The backend built on this instance's inputs; the imports every later stage needs are done here."""
        self.imported.update(imports.timed_imports(imports.modules_for(self.cfg.backend.name, self.model.model_type)))
        from corescale.backends import create_backend
        from corescale.machine import environment, instance_env
        from corescale.workload.inputs import make_inputs
        from corescale.workload.samples import QuerySet

        cfg, spec = self.cfg, self.spec
        self.queries = QuerySet.load(self.files.queries) if self.files.queries else None
        self.batch = cfg.server.max_batch if cfg.scenario == "server" else 1 if self.serving else spec.batch_size
        self.inputs = make_inputs(self.model, self.batch, cfg.sequence_length, cfg.seed, cfg.padding_fraction)
        backend = self.backend = create_backend(cfg.backend.name)
        load_start = time.perf_counter()
        backend.load(self.model, cfg, spec.threads, self.inputs)
        self.load_seconds = time.perf_counter() - load_start
        instance_env.verify_mapped(cfg, environment.mapped_libraries(), spec.id)  # asked for = really in
        prepared = backend.prepare(self.inputs)

        def call():
            return backend.forward(prepared)

        self.call = call
        if self.queries is not None and not self.serving:  # the closed loop cycles over the query set's batches
            self.call = self.tokens.cycle(backend, self.model, self.queries, spec.batch_size, cfg,
                                          self.tokenizer())
        gc.collect()  # what loading left behind (an exporter's PyTorch model) is not the backend's memory
        self.hwm_reset = reset_peak_rss()
        self.imports = imports.report(self.imported)

    def tokenizer(self):
        """tokenize=true: the model's fast tokenizer, run inside every timed call."""
        if not self.cfg.tokenize:
            return None
        from pathlib import Path

        from corescale.workload.tokens import fast_tokenizer

        assert self.files.tokenizer is not None, "a tokenize=true job names its tokenizer"
        return fast_tokenizer(Path(self.files.tokenizer), self.cfg.sequence_length)

    def warm(self) -> int | None:
        """Warm-up under the siblings' load, then warm calls until the start instant (None: aborted)."""
        from corescale.measure.timing import warm_up

        control, cfg = self.control, self.cfg
        artifact = self.backend.model_path
        control.send(protocol.Loaded(self.load_seconds, None if artifact is None else str(artifact)))
        if control.wait_for(protocol.Warmup) is None:  # every sibling is loaded: warm up under the window's load
            return None
        if self.service:
            return self.warm_service()
        self.warmed = warm_up(self.call, cfg.warmup, progress=lambda n: control.send(protocol.Warming(n)))
        self.durations = list(self.warmed.durations_ns)
        single_ns = warm_shapes(self.backend, self.model, cfg, self.batch)[0] if self.serving else None
        real = real_calls(self.backend, self.model, cfg, self.queries, self.batch) if self.serving and \
            self.queries is not None else None
        if self.serving:
            self.check_first()
        stable = sorted(self.durations[-cfg.warmup.window:])
        control.send(protocol.Ready(len(self.durations), self.warmed.converged, stable[len(stable) // 2], single_ns,
                                    real))
        return keep_warm(self.call, control, self.durations)

    def warm_service(self) -> int | None:
        """corescale serve's instance: no timed window follows, so no stable median to reach and no start instant
        to keep warm for; every shape it will answer is called as many times as its backend needs to warm a new
        shape (its registry entry's shape_warm_calls: the first call pays the allocations, a JIT backend's second
        its optimisation), then `ready` at once. Its warm call (the deadline's unit) is the fastest at the max
        batch. A third to a half of the measurement's warm-up (issue 31's cold start: 13 calls at max batch 4 were
        0.5-1.3 s of it on the shared Zen 5)."""
        from corescale.backends import entry
        from corescale.measure.timing import WarmupResult

        calls = entry(self.cfg.backend.name).shape_warm_calls
        _, at_max = warm_shapes(self.backend, self.model, self.cfg, self.batch, calls, calls)
        self.warmed = WarmupResult(at_max, True)
        self.durations = list(at_max)
        self.control.send(protocol.Ready(len(at_max), True, min(at_max), None))
        start = self.control.wait_for(protocol.Start)
        return None if start is None else start.ns

    def closed_loop(self, start_ns: int) -> None:
        """The timed window from `start_ns`, then the instance's result (its calls saved beside it)."""
        import numpy as np

        from corescale.machine import instance_env
        from corescale.measure import contamination
        from corescale.measure.timing import timed_loop

        cfg, spec, tokens, cpus = self.cfg, self.spec, self.tokens, list(self.spec.cpus)
        tokens.begin()
        watch = contamination.Watch(cpus, contamination.smt_siblings(cpus, exclude=self.trial_cpus))
        watch.start()
        cpu_before = process_cpu_seconds()
        with open(f"{spec.samples_path}.stream", "wb") as stream:  # the parent reads it if this process dies
            samples = timed_loop(self.call, start_ns, cfg.duration, max(cfg.min_iterations, len(tokens.batches)),
                                 progress=lambda n: self.control.send(protocol.Progress(n)), stream=stream)
        own_cpu = process_cpu_seconds() - cpu_before
        wall = (samples.ends_ns[-1] - start_ns) / 1e9
        foreign = watch.stop(own_cpu, wall)
        memory = memory_now()  # the measured backend's, before any reference backend loads
        np.savez(spec.samples_path, starts_ns=samples.starts_ns, ends_ns=samples.ends_ns,
                 warmup_ns=np.asarray(self.durations, dtype=np.int64))
        threads_cpus = instance_env.thread_affinities()
        real_tokens = self.real_tokens_per_sample()  # both over the timed calls: before the output check's call
        padded_tokens = tokens.per_sample(spec.batch_size, padded=True) if tokens.batches else None
        # the drift check's inputs: the fixed batch the reference runs too (a query set's calls vary in shape)
        output = self.backend.to_numpy(self.backend.forward(self.backend.prepare(self.inputs)))
        drift = self.drift(output)  # the reference loads here: before the libraries and threads are listed
        quality = self.quality()
        self.control.send(self.result(own_cpu, wall, threads_cpus, {
            **foreign,
            "peak_rss_bytes": memory.get("VmHWM") if self.hwm_reset else
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_rss_scope": "warm-up and window" if self.hwm_reset else "whole process (load included)",
            "rss_bytes": memory.get("VmRSS"),
            "real_tokens_per_sample": real_tokens,
            "padded_tokens_per_sample": padded_tokens,
        }, output_shape=list(output.shape), output_checksum=float(np.abs(output).astype(np.float64).sum()),
            drift=drift, quality=quality))

    def real_tokens_per_sample(self) -> float:
        if self.tokens.batches:
            return self.tokens.per_sample(self.spec.batch_size)
        mask = self.inputs.get("attention_mask")
        return float(mask.sum()) / self.spec.batch_size if mask is not None else self.cfg.sequence_length

    def drift(self, output) -> dict | None:
        """The outputs against the reference backend's, loaded in this process after the window."""
        if not self.cfg.reference_backend:
            return None
        from corescale.measure.drift import compare_with_reference

        return compare_with_reference(self.cfg, self.model, self.spec.threads, self.inputs, output)

    def quality(self) -> dict | None:
        """Instance 0 checks the task's outputs on the quality set against the fp32 reference (after the window:
        the reference may load in this process)."""
        if not self.files.quality or self.spec.id != 0:
            return None
        from corescale.measure import quality
        from corescale.workload.samples import QuerySet

        return quality.check(self.cfg, self.model, self.spec.threads, self.backend, QuerySet.load(self.files.quality))

    def check_first(self) -> None:
        """A served trial's instance 0 checks its artifact's quality now, before LoadGen's first test, and tells
        the parent (which runs no test when it misses the gate: measure/loadgen.py). The reference's outputs are
        computed beforehand in a process of their own (gate.reference_first) and read from the cache here, so no
        reference library, thread or memory is left in this process; what the check itself allocated is collected
        and the peak RSS starts again from here."""
        self.checked = self.quality()
        if self.checked is None:
            return
        gc.collect()
        if self.hwm_reset:
            reset_peak_rss()
        self.control.send(protocol.Checked(self.checked))

    def serve(self) -> None:
        """Answers the parent's batches until `stop`; then its result (no timed window of its own)."""
        from corescale.machine import instance_env
        from corescale.workload.samples import batch_inputs, pad_id, padded_length

        backend, model, queries, control = self.backend, self.model, self.queries, self.control
        cfg_pad, limit = self.cfg.pad, self.cfg.sequence_length
        cpu_before, began = process_cpu_seconds(), time.perf_counter_ns()
        served = rows = 0
        busy_ns = 0
        def compute(chosen: list, types: list | None) -> tuple[int, int, int, Any]:
            start_ns = time.perf_counter_ns()
            length = padded_length([len(q) for q in chosen], cfg_pad, limit)
            inputs = batch_inputs(chosen, length, pad_id(model), model.takes_token_type_ids, types)
            output = backend.to_numpy(backend.forward(backend.prepare(inputs)))
            return start_ns, time.perf_counter_ns(), length, output

        while True:
            line = sys.stdin.readline()
            try:
                command = protocol.heard(line)
            except protocol.ProtocolError as bad:  # a malformed line: that batch fails, the instance serves on
                control.send(protocol.Unanswered(protocol.infer_number(line), str(bad)))
                continue
            if isinstance(command, protocol.Infer):  # corescale serve: the token ids themselves, the output rows back
                try:  # an input the model cannot take fails its own batch, never the instance
                    start_ns, end_ns, length, output = compute(*token_rows(command))
                    reply: protocol.Message = answer((command.number, start_ns, end_ns, length,
                                                      sum(map(len, command.ids))), output)
                except Exception as exc:
                    control.send(protocol.Unanswered(command.number, f"{type(exc).__name__}: {exc}"))
                    continue
                chosen: list = command.ids
            elif isinstance(command, protocol.Batch):
                assert queries is not None, "a LoadGen worker's job names its query set"
                chosen = [queries.ids[i] for i in command.queries]
                start_ns, end_ns, length, _ = compute(chosen, None)
                reply = protocol.Served(command.number, start_ns, end_ns, length, sum(len(q) for q in chosen))
            else:
                break
            busy_ns += end_ns - start_ns
            served, rows = served + 1, rows + len(chosen)
            control.send(reply)
        wall = (time.perf_counter_ns() - began) / 1e9
        memory = memory_now()
        threads_cpus = instance_env.thread_affinities()
        cpu_seconds = process_cpu_seconds() - cpu_before
        control.send(self.result(cpu_seconds, wall, threads_cpus, {
            "busy_seconds": busy_ns / 1e9, "batches_served": served, "queries_served": rows,
            "peak_rss_bytes": memory.get("VmHWM"), "rss_bytes": memory.get("VmRSS")},
            quality=self.checked if self.checked is not None else self.quality()))

    def result(self, cpu_seconds: float, wall: float, threads_cpus: dict, measured: dict, **after) -> protocol.Result:
        """The report: the fields every scenario has, around what `measured` holds, then `after`."""
        from corescale.backends import framework_report
        from corescale.machine import environment

        return protocol.Result({
            "instance": self.spec.id, "load_seconds": self.load_seconds, "stage_seconds": dict(self.backend.timings),
            "warmup_iterations": len(self.durations), "warmup_stable_iterations": len(self.warmed.durations_ns),
            "warmup_converged": self.warmed.converged, "cpu_seconds": cpu_seconds, "wall_seconds": wall,
            "imports": self.imports, **measured,
            "affinity": sorted(set().union(*threads_cpus.values())),  # every CPU any of its threads may use
            "thread_affinity": {str(tid): cpus for tid, cpus in threads_cpus.items()},
            "framework": framework_report(self.backend), "mapped_libraries": environment.mapped_libraries(),
            "thread_count": environment.os_thread_count(), **after,
        })


class TokenCount:
    """The closed loop over a query set: which padded batch each call ran, to count real and padded tokens."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int]] = []  # (real, padded) tokens of each prepared batch
        self.calls = 0
        self.first = 0

    def cycle(self, backend, model, queries, batch: int, cfg: BenchmarkConfig, tokenizer=None):
        """The calls over the query set's batches, prepared before timing; with a tokenizer, each call tokenizes
        its batch's texts first (end to end, as a service computes)."""
        from corescale.workload.samples import offline_batches, pad_id, padded_length

        prepared = []
        for rows in offline_batches(queries.lengths, batch, cfg.pad, cfg.seed):  # in a seeded random order
            length = padded_length([int(queries.lengths[i]) for i in rows], cfg.pad, cfg.sequence_length)
            if tokenizer is None:
                prepared.append(backend.prepare(queries.rows(rows, length, pad_id(model), model.takes_token_type_ids)))
            else:
                prepared.append(queries.items(rows))
            self.batches.append((int(queries.lengths[rows].sum()), len(rows) * length))

        def call():
            self.calls += 1
            item = prepared[(self.calls - 1) % len(prepared)]
            if tokenizer is not None:  # a backend that takes text tokenizes inside its own call
                item = backend.prepare(item if getattr(backend, "takes_text", False) else
                                       tokenized(tokenizer, item, model, cfg))
            return backend.forward(item)
        return call

    def begin(self) -> None:
        self.first = self.calls

    def per_sample(self, batch: int, padded: bool = False) -> float:
        """Mean over the timed calls (the ones since begin())."""
        n = len(self.batches)
        done = [self.batches[i % n][1 if padded else 0] for i in range(self.first, self.calls)]
        return sum(done) / (len(done) * batch) if done else 0.0


def token_rows(command: protocol.Infer) -> tuple[list, list | None]:
    """An `Infer`'s rows as arrays: (token ids, token type ids or None when no row has them; zeros for a row
    without them beside rows with them)."""
    import numpy as np

    ids = [np.array(row, dtype=np.int64) for row in command.ids]
    if all(types is None for types in command.types):
        return ids, None
    return ids, [np.zeros(len(i), dtype=np.int64) if types is None else np.array(types, dtype=np.int64)
                 for types, i in zip(command.types, ids)]


def answer(done: tuple[int, int, int, int, int], output) -> protocol.Answered:
    """The output rows of one `infer` batch, as float32 little-endian bytes in base64."""
    import base64

    import numpy as np

    rows = np.ascontiguousarray(output, dtype="<f4")
    batch, start_ns, end_ns, length, real_tokens = done
    return protocol.Answered(batch, start_ns, end_ns, length, real_tokens, list(rows.shape),
                             base64.b64encode(rows.tobytes()).decode())


def tokenized(tokenizer, items: list, model, cfg: BenchmarkConfig):
    """A batch of texts (or pairs) through the fast tokenizer, padded as the pad policy says."""
    import numpy as np

    from corescale.workload.samples import batch_inputs, pad_id, padded_length

    encoded = tokenizer.encode_batch(items)
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encoded]
    length = padded_length([len(i) for i in ids], cfg.pad, cfg.sequence_length)
    types = [np.asarray(e.type_ids, dtype=np.int64) for e in encoded]
    return batch_inputs(ids, length, pad_id(model), model.takes_token_type_ids, types)


def main(argv: list[str]) -> int:
    control = Control()
    try:
        Instance(argv[0], control).run()
    except BaseException as exc:  # report everything to the parent, which decides what to show
        control.send(protocol.WorkerFailure.of(exc))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
