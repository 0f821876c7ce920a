"""The `frspec` command. Each subcommand registers itself (frspec/commands/); this module only dispatches and reports
errors."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from frspec.errors import FrspecError

# Modules that define `register(subparsers)`. Imported lazily per area so `frspec --help` stays fast and an area
# under construction cannot break the others.
_COMMAND_MODULES = [
    "frspec.commands.vocab",
    "frspec.commands.generate",
    "frspec.commands.models",
    "frspec.commands.bench",
    "frspec.commands.train",
    "frspec.commands.serve",
    "frspec.commands.tune",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="frspec",
        description="Lossless speculative decoding with frequency-ranked (FR-Spec) drafting.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(sub)
    return parser


def _log_to_stderr() -> None:
    """The library's progress notes (logger `frspec`, INFO and up: e.g. a one-time measurement that takes minutes)
    as `frspec: ...` lines on stderr, once per process. A program using frspec as a library chooses for itself."""
    logger = logging.getLogger("frspec")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("frspec: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record comes (not the one at start-up, which a caller may have
    replaced since)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _log_to_stderr()
    if getattr(args, "no_progress", False):
        from frspec.progress import hide_progress_bars

        hide_progress_bars()
    try:
        result = args.func(args)
    except FrspecError as e:
        print(f"frspec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("frspec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; stop quietly like other Unix tools.
        sys.stderr.close()
        return 141
    except OSError as e:
        # The environment, not a bug: an unwritable or vanished path, a full disk. Name the path, one line.
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"frspec: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
