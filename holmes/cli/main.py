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
import warnings
from collections.abc import Sequence

from holmes import __version__
from holmes.errors import HolmesError
from holmes.progress import compile_notice

# name -> one-line help; the module holmes.cli.<module> provides add_parser/run
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "localize": ("localize_cmd", "rank the devices most likely making a job slow"),
    "simulate": ("simulate_cmd", "generate a CommOps job of hybrid-parallel training with injected faults"),
    "detect": ("detect_cmd", "flag the abnormal operators of some ranks of a job"),
    "convert": ("convert_cmd", "convert captured traces (kineto, flight-recorder, wia, nccl-inspector) to a job"),
    "train": ("train_cmd", "train an abnormal-operator detector from labelled jobs"),
    "watch": ("watch_cmd", "follow a live job and print one JSON line per irregularity, straggler or hang"),
    "report": ("report_cmd", "write a self-contained HTML report of a job's localization"),
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


def _one_line(text: str, limit: int = 2000) -> str:
    msg = " ".join(str(text).split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _fail(command: str, msg: str) -> int:
    sys.stderr.write(f"holmes {command}: {_one_line(msg)}\n")
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``holmes`` command; returns the exit status.

    0 on success; 2 with exactly one line on stderr for bad input (a :class:`HolmesError`, an
    unreadable file, input nested too deeply, memory exhausted) and, as a last resort, for any
    other failure (``internal error: ...``; ``-vv`` logs the traceback); 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    lg = logging.getLogger("holmes")
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
    elif not lg.handlers:
        lg.addHandler(logging.NullHandler())  # no stray log lines next to the one-line error
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    command = args.command
    try:
        with warnings.catch_warnings(), compile_notice(enabled=not getattr(args, "quiet", False)):
            if not args.verbose:  # library warnings are in the output (convert) or the report
                warnings.simplefilter("ignore")
            return int(args._run(args) or 0)
    except HolmesError as exc:
        return _fail(command, str(exc))
    except KeyboardInterrupt:
        sys.stderr.write("holmes: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except RecursionError:
        return _fail(command, "input nested too deeply to process")
    except MemoryError:
        return _fail(command, "out of memory while processing the input (see docs/limits.md)")
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(command, f"{where}{exc.strerror or exc}")
    except Exception as exc:  # noqa: BLE001 - the edge: never a traceback
        lg.debug("internal error", exc_info=True)
        return _fail(command, f"internal error: {type(exc).__name__}: {exc} (rerun with -vv for details; "
                              "please report it)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
