"""``holmes convert --from FORMAT SRC JOB [--overwrite]``: captured traces -> CommOps job."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from holmes.adapters import FORMATS, ConvertWarning, convert
from holmes.progress import terminal_progress

log = logging.getLogger(__name__)


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="fmt", required=True, choices=sorted(FORMATS),
                        help="format of SRC")
    parser.add_argument("src", metavar="SRC", help="trace file or directory (never modified)")
    parser.add_argument("job", metavar="JOB", help="job directory to write (must not exist or be empty)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing job directory whole (never merged)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="override the world size (kineto, flight-recorder, nccl-inspector)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no conversion warnings")


def run(args: argparse.Namespace) -> int:
    options = {}
    if args.world_size is not None:
        from holmes.limits import check_world_size

        check_world_size(args.world_size, "--world-size")
        if args.fmt == "wia":
            from holmes.errors import ConfigError

            raise ConfigError("--world-size does not apply to --from wia (sizes come from its meta yaml)")
        options["world_size"] = args.world_size
    from holmes.adapters.build import check_output

    check_output(args.job, args.overwrite, src=args.src)  # before parsing: never clobber, never inside SRC
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvertWarning)
        out = convert(args.fmt, args.src, args.job, overwrite=args.overwrite,
                      progress=terminal_progress(enabled=not args.quiet), **options)
    if not args.quiet:
        for w in caught:
            if issubclass(w.category, ConvertWarning):
                sys.stderr.write(f"holmes convert: warning: {w.message}\n")
    sys.stdout.write(f"{out}\n")
    return 0
