"""`corescale` command line. Bad input: one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import argparse
import logging
import sys

from corescale.commands import add_common, command_modules
from corescale.errors import UserError

EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage dump -> our one-line contract
        raise UserError(f"{self.prog}: {message}")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="corescale", description="Benchmark transformer inference on CPUs.")
    add_common(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for module in command_modules():
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                            format="%(levelname)s %(name)s: %(message)s")
        return args.handler(args)
    except UserError as exc:
        if debug:
            raise
        print(f"corescale: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("corescale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
