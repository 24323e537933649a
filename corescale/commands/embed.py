"""`corescale embed BUNDLE INPUT OUTPUT`: a corpus through the bundle's measured layout (docs/embed.md)."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.commands.serve import whole_number

ORDER = 77


def register(sub) -> None:
    parser = sub.add_parser("embed", help="put a corpus (Parquet, JSONL, CSV) through a bundle's measured layout")
    add_common(parser)
    parser.add_argument("bundle", metavar="BUNDLE", help="a bundle folder (corescale run --bundle DIR, a tune's "
                        "bundle/)")
    parser.add_argument("input", metavar="INPUT", help="a .parquet, .jsonl or .csv file, or a folder of them")
    parser.add_argument("output", metavar="OUTPUT", help="the folder of Parquet shards (new, empty, or this same "
                        "job's: then it resumes)")
    parser.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    parser.add_argument("--pair-column", help="a reranker's: the column holding each pair's second text (the "
                        "text column holds the query)")
    parser.add_argument("--id-column", help="a column kept beside each output row (default: none; `row`, the "
                        "input row's number, is always there)")
    parser.add_argument("--dtype", choices=("float32", "int8", "binary"),
                        help="how vectors are written (default float32; int8 and binary: what they cost is "
                             "measured on the first shard and recorded in manifest.json)")
    parser.add_argument("--truncate", action="store_true",
                        help="cut texts over the model's length (default: they go to the rejects)")
    parser.add_argument("--shard-rows", type=whole_number, default=8192,
                        help="input rows per output shard: the length-sorting window and what a restart may redo "
                             "(default 8192)")
    parser.add_argument("--max-input-chars", type=whole_number, default=100_000,
                        help="characters of one text, before tokenizing; longer ones are rejected (default 100000)")
    parser.add_argument("--ray", metavar="ADDRESS", help="run the job on a Ray cluster as Ray Data map_batches, one "
                        "actor per measured instance on each node (host:port of its head, auto for RAY_ADDRESS, "
                        "local for a private one here); INPUT and OUTPUT on storage every node mounts")
    parser.add_argument("--catalog", help="the machine catalog for the estimate's cost (default: the packaged one)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    trust = parser.add_argument_group("bundles are code (docs/deploy.md#a-bundle-is-code-serve-only-bundles-you-trust)")
    trust.add_argument("--trust-remote-code", action="store_true",
                       help="let a bundle whose config asks for trust_remote_code run its model folder's Python")
    trust.add_argument("--allow-pickle", action="store_true",
                       help="let a bundle whose config asks for allow_pickle load pickle weights")
    trust.add_argument("--verify", metavar="KEYFILE", help="run the bundle only if its manifest.sig verifies")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    import importlib.util

    from corescale.errors import UserError

    missing = [m for m in ("pyarrow", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"corescale embed needs {', '.join(missing)}: pip install 'corescale[serve]'")
    from corescale.embed.corpus import Columns
    from corescale.embed.job import Options
    from corescale.embed.start import run
    from corescale.serve.manifest import read_key
    from corescale.serve.opened import Trust

    options = Options(Columns(args.text_column, args.pair_column, args.id_column), args.dtype, args.truncate,
                      args.shard_rows, not args.no_progress, args.max_input_chars, args.catalog,
                      Trust(args.trust_remote_code, args.allow_pickle),
                      read_key(args.verify) if args.verify else None, args.ray)
    return run(args.bundle, args.input, args.output, options)
