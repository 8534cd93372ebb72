"""`paraxis checkpoint`: look inside a checkpoint, convert it, move weights to and from
Hugging Face. torch is imported only when an action runs (the CLI builds every parser).

    paraxis checkpoint info runs/x/checkpoints
    paraxis checkpoint convert runs/x/checkpoints/step-00000100 out/ --layout tp=4,pp=2
    paraxis checkpoint import-hf path/to/hf-llama out/       # then train --init-from out
    paraxis checkpoint export-hf runs/x/checkpoints hf-out/   # transformers loads hf-out
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from paraxis.files.checkpoint_ownership import check_not_a_run_folder
from paraxis.files.host import check_writable_folder, write_error_reason
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="what a checkpoint holds")
    info.add_argument("path", help="a step-N directory or a directory of them (the latest)")
    info.add_argument("--json", action="store_true")
    conv = sub.add_parser("convert", help="rewrite a checkpoint for another layout")
    conv.add_argument("source")
    conv.add_argument("destination", help="directory that receives step-N/")
    conv.add_argument("--layout", required=True, help="e.g. dp=2,tp=4,pp=2 or dp=1 for one "
                      "device")
    imp = sub.add_parser("import-hf", help="a Hugging Face Llama, GPT-2 or Mixtral directory "
                         "as a checkpoint")
    imp.add_argument("source", help="directory with config.json and model.safetensors")
    imp.add_argument("destination", help="directory that receives step-00000000/")
    imp.add_argument("--layout", default="dp=1", help="layout to cut the files for")
    exp = sub.add_parser("export-hf", help="a checkpoint's weights as a Hugging Face directory")
    exp.add_argument("source", help="a step-N directory or a directory of them (the latest)")
    exp.add_argument("destination", help="new directory for config.json + model.safetensors")


def run(args: argparse.Namespace) -> int:
    from paraxis.model.checkpoint.convert import convert, export_hf, import_hf
    from paraxis.model.checkpoint.load import CheckpointReader

    source = args.path if args.action == "info" else args.source
    if not source.strip():  # "" would read the working folder
        raise ParaxisError(f"the checkpoint {args.action} source is empty; give a checkpoint "
                           "(or Hugging Face model) directory")
    layout = getattr(args, "layout", None)
    if layout is not None and not layout.strip():  # "" would mean dp=1, unsaid
        raise ParaxisError("--layout is empty; give the layout to cut the files for, e.g. "
                           "dp=1 for one device or dp=2,tp=2")
    if args.action in ("convert", "import-hf", "export-hf"):
        # the text, not a Path: "" (the working folder) is refused
        check_writable_folder(args.destination, "the destination", "ckpt/converted")
        destination = Path(args.destination)
        if args.action != "export-hf":
            check_not_a_run_folder(destination, f"checkpoint {args.action}")
        source = Path(args.source).resolve()
        if destination.resolve().is_relative_to(source):
            raise ParaxisError(f"the destination {destination} lies inside the source "
                               f"{args.source}; write it outside the checkpoint")
        from safetensors import SafetensorError  # lazy: its writes fail in its own error

        try:
            if args.action == "export-hf":
                print(f"wrote {export_hf(args.source, destination)}")
                return 0
            write = convert if args.action == "convert" else import_hf
            final = write(args.source, destination, Layout.parse(args.layout))
        except OSError as error:  # a disk that filled up, a folder that vanished
            raise ParaxisError(f"cannot write {error.filename or destination} "
                               f"({error.strerror}); free space or choose another "
                               "destination") from None
        except SafetensorError as error:  # safetensors' own: "No space left on device"
            raise ParaxisError(f"cannot write {destination} ({write_error_reason(error)}); "
                               "free space or choose another destination") from None
        print(f"wrote {final} for layout {Layout.parse(args.layout)}")
        return 0
    reader = CheckpointReader(args.path)
    manifest = reader.manifest
    cfg = reader.model_config()
    from paraxis.model.transformer import parameter_shapes

    trained = parameter_shapes(cfg)  # not the buffers (an MoE's routing bias)
    problems = reader.verify()  # every file's size and checksum: info vouches for them
    if problems:
        raise ParaxisError(problems[0])
    summary = {"path": str(reader.directory), "step": manifest["step"],
               "layout": manifest["layout"], "world_size": manifest["world_size"],
               "model": manifest["model"].get("name"),
               "parameters": sum(math.prod(reader.pieces[("param", n)][0]["shape"])
                                 for n in reader.names() if n in trained),
               "has_optimizer": manifest.get("has_optimizer", False),
               "files": len(manifest["files"]),
               "bytes": sum(f["bytes"] for f in manifest["files"].values())}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for key, value in summary.items():
            print(f"{key:>14}: {value:,}" if isinstance(value, int) and not isinstance(
                value, bool) else f"{key:>14}: {value}")
    return 0
