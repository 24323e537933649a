"""`corescale` command line. Bad input: one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from corescale.commands import add_common, command_modules
from corescale.errors import UserError

EXIT_USAGE = 2
EXIT_PIPE = 141  # 128 + SIGPIPE


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage dump -> our one-line contract
        raise UserError(f"{self.prog}: {message}")


def build_parser(command: str | None = None) -> ArgumentParser:
    """The whole command line; `command`: only that subcommand registered (the one argv names), as the others'
    modules import what their options need (the config's stack, the record's statistics) at registration."""
    parser = ArgumentParser(prog="corescale", description="Benchmark transformer inference on CPUs.")
    add_common(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for module in command_modules(command):
        module.register(sub)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Like parse_args, but overrides may come after options too (`run model=x --no-progress duration=1`):
    argparse fills a positional list only once, the later words are appended in their order."""
    parser = build_parser(next((word for word in argv if not word.startswith("-")), None))
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "overrides", None), list) and not any(w.startswith("-") for w in extra):
        args.overrides.extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def tour(parser: ArgumentParser) -> str:
    """`corescale` alone: the subcommands in the order a user meets them, one line each."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = ["corescale: how to deploy a transformer on this CPU (or the one to buy). Start here:", ""]
    for action in sub._choices_actions:
        lines.append(f"  corescale {action.dest:<9} {action.help}")
    lines += ["", "`corescale COMMAND --help` shows a command's options; docs/cli.md has them all."]
    return "\n".join(lines)


def quiet_libraries(verbose: int) -> None:
    """No third-party warnings or progress noise on the console unless -v: what matters is said in corescale's
    own words (the workers' libraries write to their own logs)."""
    if verbose:
        return
    import warnings

    warnings.filterwarnings("ignore", module=r"^(?!corescale)")
    for name in ("optuna", "transformers", "huggingface_hub", "torch", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        if not argv:
            print(tour(build_parser()))
            return 0
        args = parse(argv)
        logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                            format="%(levelname)s %(name)s: %(message)s")
        quiet_libraries(args.verbose)
        return args.handler(args)
    except UserError as exc:
        if debug:
            raise
        print(f"corescale: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("corescale: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly, as a SIGPIPE'd tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
