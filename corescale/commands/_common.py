"""Helpers shared by the commands (discovery skips modules whose names start with `_`)."""

from __future__ import annotations


def add_loop_options(parser, what: str = "trial") -> None:
    """Options of every command that runs trials through the loop."""
    parser.add_argument("--fail-fast", action="store_true", help=f"stop at the first failed {what}")
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.add_argument("--rerun", action="store_true",
                        help="measure every trial again, even those with a valid result under the results root")


def on_lock_wait(path, holder: str) -> None:
    """What every measuring command says before it waits for the machine lock (machine/lock.py)."""
    from corescale.report.console import errors

    held = f"; held by {holder}" if holder else ""
    errors.print(f"waiting for another corescale trial or measurement on this machine to finish (lock {path}{held})",
                 soft_wrap=True, markup=False)


def add_selection(parser) -> None:
    """Options shared by every command that reads a results root."""
    parser.add_argument("--where", action="append", default=[], metavar="COL=VALUE",
                        help="keep rows matching (repeatable; =, !=, <, <=, >, >=; a,b for any of)")
    parser.add_argument("--all", action="store_true", help="every attempt, not only the latest per trial key")


def load_table(root, args):
    """The table, with unreadable files reported on stderr (one line each) and skipped."""
    from corescale.analysis import store
    from corescale.report.console import errors, print_note

    table = store.load(root, latest=not args.all, where=args.where)
    for _path, reason in table.problems:
        print_note(reason, lead="skipped:")
    if table.unfinished:
        errors.print(f"note: {table.unfinished} unfinished run dir(s) (.tmp-*: killed or still running) ignored")
    return table


def _number(text: str, minimum: float, inclusive: bool) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got '{text}' (nan and inf are not allowed)")
    if value < minimum or (value == minimum and not inclusive):
        raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum:g}, got '{text}'")
    return value


def path_arg(text: str) -> str:
    """argparse type= of every option that names a file or directory: an empty one is refused (it would mean
    the working directory, or nothing)."""
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def positive_number(text: str) -> float:
    """argparse type= of options such as --price-per-hour and --slo-p99-ms: a finite number > 0."""
    return _number(text, 0.0, inclusive=False)


def fraction_number(text: str) -> float:
    """argparse type= of --threshold: a finite number >= 0 (a fraction: 0.05 = 5 %)."""
    return _number(text, 0.0, inclusive=True)


def check_csv_dest(dest: str | None) -> None:
    """--csv PATH refused before any work when it cannot be written ('-' is stdout)."""
    from corescale.userfiles import check_writable

    if dest and dest != "-":
        check_writable(dest, "--csv", parents=False)


def write_csv(frame, dest: str) -> None:
    """CSV to stdout ('-') or to a file, written whole (temp file + rename)."""
    from pathlib import Path

    from corescale.record.files import write_atomic

    text = frame.to_csv(index=False)
    if dest == "-":
        print(text, end="")
        return
    write_atomic(Path(dest), text, "--csv")
