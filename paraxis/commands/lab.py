"""`paraxis lab --out DIR [--screenshots]`: write the interactive lab page (and, for the docs,
one screenshot per widget taken in headless Chromium)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/lab",
                        help="folder to write lab.html into (default runs/lab)")
    parser.add_argument("--screenshots", metavar="DIR", default=None,
                        help="also save lab-<widget>.png of every widget into DIR (needs "
                             "chromium, chromium-driver and selenium), e.g. docs/img")


def run(args: argparse.Namespace) -> int:
    from paraxis.files.host import check_writable_folder
    from paraxis.show.lab.page import write_lab  # the library's figures, only when run

    for flag, folder in (("--out", args.out), ("--screenshots", args.screenshots)):
        if folder is not None:  # both before anything is written
            check_writable_folder(folder, flag, "runs/lab")
    path = write_lab(args.out)
    print(f"lab: {path.resolve()} ({path.stat().st_size / 1e6:.1f} MB, opens from disk)")
    if args.screenshots:
        from paraxis.show.lab.browser import screenshots  # selenium only when asked for

        for shot in screenshots(path, Path(args.screenshots)):
            print(f"screenshot: {shot}")
    return 0
