"""Options every command spells the same way: --dtype, --device, --threads, --seed.

Values are checked where they are used (frspec.models.loading parses dtypes and devices, `set_threads` refuses
counts below one), so a bad value gives the same one-line `frspec: error:` from every command; argparse choices
would print a usage block instead.
"""

from __future__ import annotations

import argparse

# Model dtypes a command accepts (frspec.models.loading.parse_dtype reads them); "auto" is decided per model and
# device (see load_model).
DTYPE_CHOICES = ("auto", "bf16", "fp16", "fp32", "fp64")
# One default seed for every command that samples or shuffles: runs are reproducible unless asked otherwise.
DEFAULT_SEED = 0


def add_dtype(parser: argparse.ArgumentParser, auto: str = "bf16 on CPU, the model's half dtype on a GPU",
              name: str = "--dtype", what: str = "model dtype", default: str = "auto") -> None:
    parser.add_argument(name, default=default, metavar="{" + ",".join(DTYPE_CHOICES) + "}",
                        help=f"{what}: {', '.join(DTYPE_CHOICES)} (auto: {auto}; default: %(default)s)")


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: %(default)s)")


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")


def add_seed(parser: argparse.ArgumentParser, what: str = "sampling seed") -> None:
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"{what} (default: %(default)s)")
