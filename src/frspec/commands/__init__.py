"""The `frspec` subcommands, one module each (vocab, models, generate, bench, train), and the options they share
(options.py). Each module defines `register(subparsers)`; frspec/cli.py dispatches."""
