"""`corescale embed BUNDLE INPUT OUTPUT`: a corpus through the bundle's measured layout, on serve's engine (the
bundle's pinned instances behind its batcher, serve/pool.py), resumable shard by shard (docs/embed.md).

corpus.py reads the input (Parquet, JSONL, CSV; a file or a folder of them) as a stream of rows; output.py owns the
output folder (the job's identity, atomic shards, the manifest); columns.py turns a task's outputs into columns;
estimate.py says how long and what it costs before it starts; job.py runs it."""
