"""The `--quant` / `--draft-quant` command-line options, shared by `frspec generate` and `frspec bench`.

    add_quant_options(parser)
    target = load_model(spec, ..., quant=args.quant)
    draft = load_model(spec, ..., **draft_load_options(args))   # head kept float until the drafter picks rows
    quantize_drafter_head(generator.drafter, draft_quant(args))
"""

from __future__ import annotations

import argparse

from frspec.models.quant import parse_quant

CHOICES = ("int4", "int8", "none")


def add_quant_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quant", default="none", choices=CHOICES,
                        help="run the target's (and draft's) linear layers and LM head on PyTorch's weight-only "
                             "int4 (groups of 32; GGUF Q4_K blocks converted exactly) or int8 kernels; "
                             "activations stay in --dtype (default: %(default)s)")
    parser.add_argument("--draft-quant", default=None, choices=CHOICES,
                        help="quantization of the draft model (default: as --quant)")


def target_quant(args: argparse.Namespace) -> str | None:
    return parse_quant(getattr(args, "quant", None))


def draft_quant(args: argparse.Namespace) -> str | None:
    value = getattr(args, "draft_quant", None)
    return parse_quant(value) if value is not None else target_quant(args)


def draft_load_options(args: argparse.Namespace) -> dict:
    """load_model keywords for a draft model: its LM head stays float so that an FR-Spec drafter can copy the
    map's rows from it; quantize_drafter_head quantizes the drafter's head afterwards."""
    return {"quant": draft_quant(args), "quantize_head": False}
