"""Entry point of the ``holmes`` command.

Each subcommand lives in its own module ``holmes.cli.<name>`` exposing ``add_parser(subparsers)``
and ``run(args) -> int``. Errors deriving from :class:`holmes.HolmesError` (and bad arguments)
exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from holmes import __version__
from holmes.errors import HolmesError

# name -> one-line help; the module holmes.cli.<module> provides add_parser/run
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "localize": ("localize_cmd", "rank the devices most likely making a job slow"),
    "simulate": ("simulate_cmd", "generate a CommOps job of hybrid-parallel training with injected faults"),
    "detect": ("detect_cmd", "flag the abnormal operators of some ranks of a job"),
    "convert": ("convert_cmd", "convert captured traces (kineto, flight-recorder, wia, nccl-inspector) to a job"),
    "train": ("train_cmd", "train an abnormal-operator detector from labelled jobs"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _load(module: str):
    try:
        return importlib.import_module(f"holmes.cli.{module}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("holmes.cli."):
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="holmes", description="Localize the devices that make distributed training slow.")
    parser.add_argument("--version", action="version", version=f"holmes {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log progress to stderr (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in SUBCOMMANDS.items():
        mod = _load(module)
        if mod is None:
            p = sub.add_parser(name, help=f"{help_text} (not built yet)", add_help=True)
            p.set_defaults(_run=_not_built(name))
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        else:
            p = sub.add_parser(name, help=help_text, description=help_text)
            mod.add_parser(p)
            p.set_defaults(_run=mod.run)
    return parser


def _not_built(name: str):
    def run(args: argparse.Namespace) -> int:
        sys.stderr.write(f"holmes {name}: not built yet in this version\n")
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        lg = logging.getLogger("holmes")
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except HolmesError as exc:
        msg = " ".join(str(exc).split())
        sys.stderr.write(f"holmes {args.command}: {msg}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("holmes: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
