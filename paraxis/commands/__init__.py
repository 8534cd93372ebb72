"""The `paraxis` subcommands: one module each, with `add_arguments(parser)` and
`run(args) -> int`, nothing else (`paraxis/cli.py` lists them)."""
