"""`corescale serve BUNDLE`: an HTTP service running exactly what a bundle measured (docs/deploy.md)."""

from __future__ import annotations

import os
import sys

from corescale.commands import add_common
from corescale.measure.http.contract import API_KEY_ENV
from corescale.serve.limits import Limits

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
    parser.add_argument("--fronts", type=whole_number,
                        help="front processes sharing the port, each before its share of the instances (it must "
                        "divide them; default: the bundle's server.fronts, else 1): one front's event loop caps the "
                        "requests/s (docs/deploy.md)")
    parser.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    add_names(parser)
    add_protections(parser)
    trust = parser.add_argument_group("bundles are code (docs/deploy.md#a-bundle-is-code-serve-only-bundles-you-trust)")
    trust.add_argument("--trust-remote-code", action="store_true",
                       help="let a bundle whose config asks for trust_remote_code run its model folder's Python "
                            "(only for bundles you trust)")
    trust.add_argument("--allow-pickle", action="store_true",
                       help="let a bundle whose config asks for allow_pickle load pickle weights, which can run "
                            "code (only for bundles you trust)")
    trust.add_argument("--verify", metavar="KEYFILE",
                       help="serve the bundle only if its manifest.sig verifies with the key in KEYFILE")
    trust.add_argument("--sign", metavar="KEYFILE",
                       help="check the bundle as serving does, sign it with the key in KEYFILE (manifest.sig, "
                            "HMAC-SHA256 of its manifest) and exit without serving")
    parser.set_defaults(handler=handle)


def add_protections(parser) -> None:
    """What bounds the service's cost, as `serve` and `deploy` take them (every target applies them)."""
    parser.add_argument("--max-queue", type=whole_number, default=256,
                        help="inputs accepted and not yet answered before requests get 429 (default 256)")
    parser.add_argument("--max-inputs", type=whole_number, default=32,
                        help="inputs one request may hold before it gets 413 (default 32)")
    defaults = Limits()
    limits = parser.add_argument_group("limits (each checked before any work: docs/deploy.md)")
    limits.add_argument("--payload-limit", type=whole_number, default=defaults.payload_bytes, metavar="BYTES",
                        help=f"bytes of one request's body, then 413 (default {defaults.payload_bytes})")
    limits.add_argument("--max-input-chars", type=whole_number, default=defaults.input_chars,
                        help=f"characters of one input, before tokenizing, then 413 (default {defaults.input_chars})")
    limits.add_argument("--max-request-chars", type=whole_number, default=defaults.request_chars,
                        help=f"characters of a request's inputs, then 413 (default {defaults.request_chars})")
    limits.add_argument("--max-request-tokens", type=whole_number, default=defaults.request_tokens,
                        help=f"tokens of a request's inputs, then 413 (default {defaults.request_tokens})")
    limits.add_argument("--max-answer-floats", type=whole_number, default=defaults.answer_floats,
                        help=f"floats in one /embed_all answer, then 413 (default {defaults.answer_floats})")
    limits.add_argument("--auto-truncate", action="store_true",
                        help="cut inputs longer than the model takes instead of answering 413 (TEI's name)")
    limits.add_argument("--max-connections", type=whole_number, default=1000,
                        help="connections and requests at once, then 503 (uvicorn's limit_concurrency; default 1000)")
    limits.add_argument("--receive-timeout", type=seconds, default=30.0, metavar="SECONDS",
                        help="a request's headers and body must arrive within this, else the connection is closed "
                        "(slow clients; default 30)")
    parser.add_argument("--batch-timeout", type=seconds, metavar="S",
                        help="a batch's deadline: S seconds plus 20 of the instance's warm calls; past it the "
                        "instance is killed and started again and the batch's requests get 503 (default 10)")
    parser.add_argument("--queue-timeout", type=seconds, metavar="S",
                        help="the longest an input waits in the queue for an instance; past it its request gets "
                             "503, whatever the instances do (default 30)")


def protections(args) -> dict:
    """The service's bounds from add_protections' options, as serve.service.Options' fields."""
    limits = Limits(args.payload_limit, args.max_inputs, args.max_input_chars, args.max_request_chars,
                    args.max_request_tokens, args.max_answer_floats, args.auto_truncate)
    return {"max_queue": args.max_queue, "max_inputs": args.max_inputs, "limits": limits,
            "max_connections": args.max_connections, "receive_timeout_s": args.receive_timeout,
            **({"batch_timeout": args.batch_timeout} if args.batch_timeout else {}),
            **({"queue_timeout": args.queue_timeout} if args.queue_timeout else {})}


def protection_words(args) -> list[str]:
    """The protections given on this command line that differ from their defaults, as `corescale serve` words (a
    target that runs serve elsewhere, Kubernetes' pods, passes them on)."""
    import argparse

    blank = argparse.ArgumentParser(add_help=False)
    add_protections(blank)
    words: list[str] = []
    for action in blank._actions:
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        words += [flag] if isinstance(action, argparse._StoreTrueAction) else [flag, f"{value:g}" if
                                                                              isinstance(value, float) else str(value)]
    return words


def add_names(parser) -> None:
    """--served-model-name, as serve and deploy take it."""
    parser.add_argument("--served-model-name", nargs="+", metavar="NAME", default=[],
                        help="the model id(s) the service answers to (OpenAI's `model`, GET /v1/models); the first is "
                             "the one answers carry (default: the bundle's model and the names its folder records)")


def whole_number(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got '{text}'")
    return int(text)


def seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got '{text}'")
    return value


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
    from corescale.serve.names import checked
    from corescale.serve.service import Options, run

    if len(args.source) > 1 and not all("=" in word for word in args.source):
        raise UserError(f"serve takes one bundle folder or overrides (key=value), not {' '.join(args.source)}")
    from corescale.measure.http.contract import is_loopback_host
    from corescale.serve.manifest import read_key
    from corescale.serve.opened import Trust

    trust = Trust(args.trust_remote_code, args.allow_pickle)
    if (args.sign or args.verify) and ("=" in args.source[0] or os.path.isfile(args.source[0])):
        raise UserError("--sign and --verify take a bundle folder")
    if args.sign:
        from corescale.serve.opened import sign_bundle

        print(f"corescale serve: signed: {sign_bundle(args.source[0], read_key(args.sign), trust)}")
        return 0
    if args.api_key is not None and not args.api_key.strip():
        raise UserError(f"the API key is empty (--api-key or ${API_KEY_ENV}): give a key, or unset {API_KEY_ENV} "
                        "to serve without one")
    if args.api_key is None and not is_loopback_host(args.host):
        print(f"corescale serve: warning: listening on {args.host} with no API key: whoever reaches this port "
              f"can use the service and read /info (set ${API_KEY_ENV})", file=sys.stderr, flush=True)
    return run(args.source, Options(args.host, args.port, args.api_key, access_log=args.access_log, trust=trust,
                                    key=read_key(args.verify) if args.verify else None, fronts=args.fronts,
                                    served_model_names=tuple(checked(args.served_model_name)), **protections(args)))
