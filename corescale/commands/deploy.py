"""`corescale deploy BUNDLE --target {kubernetes,ray}`: a measured bundle handed to a serving engine (docs/deploy.md,
docs/ray.md). The targets are deploy/'s registry; each is checked (known, built, its modules installed, --out new
or empty where it writes files) and the bundle read as `corescale serve` reads it before anything is written or
started."""

from __future__ import annotations

import os

from corescale.commands import add_common
from corescale.commands._common import path_arg
from corescale.commands.serve import (
    add_names,
    add_protections,
    port_number,
    protection_words,
    protections,
    whole_number,
)
from corescale.measure.http.contract import API_KEY_ENV

ORDER = 76


def register(sub) -> None:
    from corescale.deploy import TARGETS

    parser = sub.add_parser("deploy", help="hand a bundle to Kubernetes (manifests) or Ray Serve (an application)")
    add_common(parser)
    parser.add_argument("bundle", type=path_arg, metavar="BUNDLE", help="a bundle folder (run --bundle DIR)")
    parser.add_argument("--target", required=True, choices=sorted(TARGETS),
                        help="; ".join(f"{name}: {entry.summary}" for name, entry in TARGETS.items()))
    parser.add_argument("--out", type=path_arg, metavar="DIR",
                        help="where a target that writes files writes them (a new or empty folder)")
    parser.add_argument("--name", help="the application's / objects' name (default: from the model's name)")
    parser.add_argument("--image", help="kubernetes: the image built from the bundle's Dockerfile.example "
                        "(default: NAME:TAG, TAG the first 12 hex digits of the manifest's sha256)")
    parser.add_argument("--namespace", help="kubernetes: the objects' namespace (default: kubectl's)")
    parser.add_argument("--threads-per-core", type=whole_number, metavar="N",
                        help="kubernetes: the nodes' hardware threads per core, when not the measuring machine's "
                        "(a pod asks for whole cores: cores x N CPUs)")
    parser.add_argument("--host", default="127.0.0.1", help="ray: address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8080, help="ray: port (default 8080)")
    parser.add_argument("--address", metavar="HOST:PORT",
                        help="ray: the Ray cluster to run on (HOST:PORT of its head, or auto; default: a private "
                        "local cluster on loopback, stopped at the end)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"ray: require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    trust = parser.add_argument_group("bundles are code (docs/deploy.md#a-bundle-is-code-serve-only-bundles-you-trust)")
    trust.add_argument("--trust-remote-code", action="store_true",
                       help="let a bundle whose config asks for trust_remote_code run its model folder's Python")
    trust.add_argument("--allow-pickle", action="store_true",
                       help="let a bundle whose config asks for allow_pickle load pickle weights")
    trust.add_argument("--verify", metavar="KEYFILE", type=path_arg,
                       help="deploy the bundle only if its manifest.sig verifies with the key in KEYFILE")
    parser.add_argument("--no-api-key", action="store_true",
                        help="kubernetes: the pods serve without an API key (by default they need the Secret "
                             "NAME-api-key and do not start without it)")
    parser.add_argument("--behind-proxy", action="store_true",
                        help="ray: serve on a non-loopback --host although Ray Serve's proxy lacks serve's connection "
                             "protections, because a reverse proxy in front bounds them (docs/deploy.md)")
    add_names(parser)
    add_protections(parser)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from pathlib import Path

    from corescale.deploy import DeployOptions, runner, target
    from corescale.deploy.source import check_out
    from corescale.errors import UserError
    from corescale.serve.manifest import read_key
    from corescale.serve.names import checked
    from corescale.serve.opened import Trust

    found = target(args.target)
    out = None
    if found.writes:
        out = check_out(Path(args.out) if args.out else None)
    elif args.out:
        raise UserError(f"deploy target '{args.target}' writes no files: leave out --out")
    if args.api_key is not None and not args.api_key.strip():
        raise UserError(f"the API key is empty (--api-key or ${API_KEY_ENV}): give a key, or unset {API_KEY_ENV}")
    options = DeployOptions(out, args.host, args.port, args.api_key, Trust(args.trust_remote_code, args.allow_pickle),
                            read_key(args.verify) if args.verify else None, args.name, args.image, args.namespace,
                            args.threads_per_core, args.address, tuple(checked(args.served_model_name)),
                            protections(args), tuple(protection_words(args)), args.behind_proxy,
                            args.no_api_key)
    return runner(found)(Path(args.bundle), options)
