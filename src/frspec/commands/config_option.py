"""`--config FILE` (a decode config, decode/decode_config.py, as `frspec tune` writes it) for `generate` and `bench`.

The config fills in the options left at their defaults; an option given on the command line wins. Add the option
last in a command's `register`, so that the defaults it records are the command's own:

    add_config_option(parser, "...")           # records the parser's defaults of the options a config can set
    config = load_config(args)                  # None without --config
    apply_models(args, config)                  # target, draft (or --mtp), dtype, quant, context rows
    apply_drafting(args, config)                # generate only: the token map and the drafted shape
"""

from __future__ import annotations

import argparse

from frspec.decode.decode_config import DecodeConfig

# Options a config can set, by argparse dest; the drafted shape's four options go together (apply_drafting).
MODEL_DESTS = ("target", "draft", "dtype", "quant", "draft_quant", "context_rows", "context_budget")
SHAPE_DESTS = ("num_spec_tokens", "tree_depth", "tree_branching", "tree_budget")
DESTS = MODEL_DESTS + ("token_map", "token_map_size") + SHAPE_DESTS


def add_config_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--config", default=None, metavar="FILE", help=help)
    parser.set_defaults(config_defaults={dest: parser.get_default(dest) for dest in DESTS})


def load_config(args: argparse.Namespace) -> DecodeConfig | None:
    path = getattr(args, "config", None)
    return DecodeConfig.load(path) if path else None


def _unset(args: argparse.Namespace, dest: str) -> bool:
    """The option exists on this command and was left at its default."""
    return hasattr(args, dest) and getattr(args, dest) == args.config_defaults.get(dest)


def apply_models(args: argparse.Namespace, config: DecodeConfig | None) -> None:
    """Models, dtype, quantization and context rows from the config where the command line left them."""
    if config is None:
        return
    values = {"target": config.target, "dtype": config.dtype, "quant": config.quant,
              "draft_quant": config.draft_quant, "context_rows": config.context_rows,
              "context_budget": config.context_budget}
    if config.draft is not None and not getattr(args, "eagle", None):
        values["draft"] = config.draft
    for dest, value in values.items():
        if value is not None and _unset(args, dest):
            setattr(args, dest, value)
    # The target's own MTP layers, unless the command line names another drafter.
    if config.mtp and hasattr(args, "mtp") and not getattr(args, "draft", None) and not getattr(args, "eagle", None):
        args.mtp = True


def apply_drafting(args: argparse.Namespace, config: DecodeConfig | None) -> None:
    """The config's token map and drafted shape, for `generate`: the map (and its size) unless --token-map (or
    --eagle) is given; the shape unless any of --num-spec-tokens / --tree-depth / --tree-branching / --tree-budget
    is. A config's "auto" tree or map size is generate's `auto`."""
    if config is None or config.tree is None or getattr(args, "eagle", None):
        return
    if config.token_map_path is not None and _unset(args, "token_map"):
        args.token_map = config.token_map_path
        if _unset(args, "token_map_size"):
            args.token_map_size = str(config.token_map_size)
    if all(_unset(args, dest) for dest in SHAPE_DESTS):
        shape = config.shape
        if shape is None:  # "auto"
            args.num_spec_tokens = "auto"
            return
        if shape.kind == "chain":
            args.num_spec_tokens = shape.depth
        else:
            args.tree_depth, args.tree_branching = shape.depth, shape.branching
            args.tree_budget = shape.budget
