"""`corescale serve BUNDLE`: an HTTP service running exactly what a bundle measured (docs/deploy.md)."""

from __future__ import annotations

import os

from corescale.commands import add_common
from corescale.measure.contract import API_KEY_ENV

ORDER = 75


def register(sub) -> None:
    parser = sub.add_parser("serve", help="serve a deployment bundle over HTTP (OpenAI and TEI APIs)")
    add_common(parser)
    parser.add_argument("source", nargs="+", metavar="BUNDLE | OVERRIDES",
                        help="a bundle folder (corescale run --bundle DIR, or a tune's bundle/), or overrides as "
                             "`run` takes them (a layout that was not measured)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8080, help="port (default 8080; 0: any free one)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: "
                        f"${API_KEY_ENV})")
    parser.add_argument("--max-queue", type=whole_number, default=256,
                        help="inputs accepted and not yet answered before requests get 429 (default 256)")
    parser.add_argument("--max-inputs", type=whole_number, default=32,
                        help="inputs one request may hold before it gets 413 (default 32)")
    parser.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    parser.set_defaults(handler=handle)


def whole_number(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got '{text}'")
    return int(text)


def port_number(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got '{text}'")
    return int(text)


def handle(args) -> int:
    import importlib.util

    from corescale.errors import UserError

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"corescale serve needs {', '.join(missing)}: pip install 'corescale[serve]'")
    from corescale.serve.service import Options, run

    if len(args.source) > 1 and not all("=" in word for word in args.source):
        raise UserError(f"serve takes one bundle folder or overrides (key=value), not {' '.join(args.source)}")
    return run(args.source, Options(args.host, args.port, args.api_key or None, args.max_queue, args.max_inputs,
                                    args.access_log))
