"""`python -m paraxis.train` (what torchrun runs on every rank): the `paraxis train` command."""

import os
import sys

from paraxis.dist.bad_input import OneLineParser, run_guarded
from paraxis.train.flags import add_arguments, config_from_args
from paraxis.train.loop import run_training
from paraxis.train.start import start


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="paraxis.train", description="The training loop.")
    add_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    return run_guarded(lambda: start(config_from_args(args), run_training, debug=args.debug),
                       debug=args.debug)


if __name__ == "__main__":
    code = main()
    if code == 0 and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a rank of torchrun's
        from paraxis.dist.groups import end_rank_process

        end_rank_process(code)  # gloo's threads may still hold tensors: no finalization
    sys.exit(code)
