"""Options every command spells the same way: --dtype, --device, --threads, --seed, --quant.

Values are checked where they are used (frspec.models.loading parses dtypes and devices, `set_threads` refuses
counts below one), so a bad value gives the same one-line `frspec: error:` from every command; argparse choices
would print a usage block instead.
"""

from __future__ import annotations

import argparse

from frspec.models.dtypes import DTYPE_NAMES
from frspec.models.quant import parse_quant

# Model dtypes a command accepts (frspec.models.loading.parse_dtype reads them); "auto" is decided per model and
# device (see load_model).
DTYPE_CHOICES = ("auto", *DTYPE_NAMES.values())
# One default seed for every command that samples or shuffles: runs are reproducible unless asked otherwise.
DEFAULT_SEED = 0


def int_list(text: str) -> tuple[int, ...]:
    """An argparse type: "1,3,5" -> (1, 3, 5)."""
    try:
        return tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


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


# --quant / --draft-quant, shared by `frspec generate` and `frspec bench`: load_model(spec, quant=target_quant(args));
# a draft loads with **draft_load_options(args) (head kept float until the drafter picks its rows), and the drafter
# quantizes its own head: build_generator(..., draft_head_quant=draft_quant(args)).
QUANT_CHOICES = ("int4", "int8", "none")


def add_quant_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quant", default="none", choices=QUANT_CHOICES,
                        help="run the target's (and draft's) linear layers and LM head on PyTorch's weight-only "
                             "int4 (groups of 32; GGUF Q4_K blocks converted exactly) or int8 kernels; "
                             "activations stay in --dtype (default: %(default)s)")
    parser.add_argument("--draft-quant", default=None, choices=QUANT_CHOICES,
                        help="quantization of the draft model (default: as --quant)")


def target_quant(args: argparse.Namespace) -> str | None:
    return parse_quant(getattr(args, "quant", None))


def draft_quant(args: argparse.Namespace) -> str | None:
    value = getattr(args, "draft_quant", None)
    return parse_quant(value) if value is not None else target_quant(args)


def draft_load_options(args: argparse.Namespace) -> dict:
    """load_model keywords for a draft model: its LM head stays float so that an FR-Spec drafter can copy the
    map's rows from it; the drafter then quantizes its own head (build_drafter's head_quant)."""
    return {"quant": draft_quant(args), "quantize_head": False}
