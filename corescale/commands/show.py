"""`corescale show DIR`: re-print a saved result."""

from __future__ import annotations

import json

from corescale.commands import add_common
from corescale.commands._common import path_arg

ORDER = 30


def register(sub) -> None:
    parser = sub.add_parser("show", help="re-print a saved result")
    add_common(parser)
    parser.add_argument("path", type=path_arg)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from corescale.errors import UserError
    from corescale.record.files import read_result
    from corescale.report.console import print_result

    record = read_result(args.path)
    if record.ok and record.metrics is None and record.server is None:
        raise UserError(f"malformed result '{args.path}': its status is ok but it holds no metrics")
    if args.json:
        print(json.dumps(record.to_json(), indent=2, default=str))
    else:
        print_result(record, args.path)
    return 0 if record.ok else 1
