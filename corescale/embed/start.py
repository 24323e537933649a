"""A corpus job from the command line's words: everything checked before any worker starts (the corpus's files
and columns, the bundle as serve checks it, the task's output types, the output folder, a Ray address), the
estimate printed, then the job on this machine (job.py) or on a Ray cluster (ray_data.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corescale.embed.corpus import Corpus, discover, rows
from corescale.embed.estimate import Estimate, estimate
from corescale.embed.job import Job, Options, bundle_digest, corpus_tokens, say
from corescale.embed.output import Output
from corescale.embed.ray_data import RayJob, check_address
from corescale.errors import UserError

SAMPLE_ROWS = 2000  # the first rows tokenized for the estimate


def run(bundle_path: str, input_path: str, output_path: str, options: Options) -> int:
    from corescale.machine.scratch import scratch
    from corescale.record.files import read_result
    from corescale.serve import bundle as bundles
    from corescale.serve.opened import COPY_DIR, Trust, open_bundle
    from corescale.workload.tasks import TASKS, resolve

    if options.ray is not None:
        check_address(options.ray)
    corpus = discover(input_path, options.columns)
    with scratch("embed") as work:
        opened = open_bundle(bundle_path, work, options.trust or Trust(), options.key)
        task = opened.head.entry
        if task.corpus is None:
            able = ", ".join(t.name for t in TASKS.values() if t.corpus)
            raise UserError(f"embed: this bundle's task '{task.name}' ({task.noun}) has no corpus job; tasks with "
                            f"one: {able}")
        written = resolve(task.corpus)
        dtype = options.dtype or written.dtypes[0]
        if dtype not in written.dtypes:
            raise UserError(f"embed: --dtype {dtype} is not written for task '{task.name}'; allowed: "
                            f"{', '.join(written.dtypes)}")
        if task.pairs and options.columns.pair is None:
            raise UserError(f"embed: this bundle's task '{task.name}' scores (query, text) pairs: name the second "
                            "text's column with --pair-column")
        if not task.pairs and options.columns.pair is not None:
            raise UserError(f"embed: --pair-column is for a task that scores pairs; this bundle's '{task.name}' "
                            "takes one text")
        root = Path(bundle_path).expanduser().resolve()
        identity = {"bundle": bundle_digest(root), "corpus": corpus.identity(), "task": task.name, "dtype": dtype,
                    "truncate": options.truncate, "shard_rows": options.shard_rows}
        output = Output.open(output_path, identity)
        tokens = corpus_tokens(opened, options)
        record = read_result(work / COPY_DIR / bundles.RECORD)
        planned = planned_estimate(record, corpus, tokens, options)
        for line in planned.lines():
            say(f"estimate: {line}")
        parts = (opened, work, corpus, output, tokens, written, dtype, options, planned, root)
        if options.ray is not None:
            return RayJob(*parts, address=options.ray, identity=identity).run()
        return Job(*parts).run()


def planned_estimate(record, corpus: Corpus, tokens, options: Options) -> Estimate:
    """The estimate from the first SAMPLE_ROWS rows' real tokens."""
    sample: list[Any] = []
    for row in rows(corpus):
        if row.problem is None:
            sample.append(row.text)
        if len(sample) >= SAMPLE_ROWS:
            break
    encoded, _ = tokens.encode_each(sample, options.truncate, options.columns.pair is not None)
    return estimate(record, corpus, [len(r) for r in encoded.rows], options.catalog)
