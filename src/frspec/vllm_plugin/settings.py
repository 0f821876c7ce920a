"""Where the plugin's configuration comes from: environment variables, read in every vLLM process (workers inherit
the environment of the process that starts them).

    FRSPEC_TOKEN_MAP         the token map file (FR-Spec off when neither it nor a config gives one)
    FRSPEC_TOKEN_MAP_FORMAT  its format, if not detected from the content
    FRSPEC_TOKEN_MAP_SIZE    auto: the map is a frequency ranking and the map size is chosen per batch step
                             (batch_map_size.py); unset: the map as it is
    FRSPEC_CONFIG            a decode config (`frspec tune` writes one, decode/decode_config.py): its token map,
                             unless FRSPEC_TOKEN_MAP is set too. The draft length stays vLLM's own
                             num_speculative_tokens; a mismatch with the config's is logged as a warning.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from frspec.decode.decode_config import DecodeConfig
from frspec.errors import FrspecError
from frspec.vocab.context_vocab import BUDGETS
from frspec.vocab.token_map import TokenMap

TOKEN_MAP_ENV = "FRSPEC_TOKEN_MAP"
TOKEN_MAP_FORMAT_ENV = "FRSPEC_TOKEN_MAP_FORMAT"
CONFIG_ENV = "FRSPEC_CONFIG"
logger = logging.getLogger("vllm.frspec")  # under vLLM's logger, so it prints with vLLM's own lines


def configured() -> DecodeConfig | None:
    """The decode config FRSPEC_CONFIG names, or None; a bad file is one FrspecError naming it."""
    path = os.environ.get(CONFIG_ENV)
    return DecodeConfig.load(path) if path else None


MAP_SIZE_ENV = "FRSPEC_TOKEN_MAP_SIZE"


def auto_map_size() -> bool:
    """Whether the map size is chosen per batch step: FRSPEC_TOKEN_MAP_SIZE=auto, or a FRSPEC_CONFIG whose
    token_map_size is auto (unless FRSPEC_TOKEN_MAP_SIZE is set)."""
    text = (os.environ.get(MAP_SIZE_ENV) or "").strip()
    if text:
        if text.lower() != "auto":
            raise FrspecError(f"{MAP_SIZE_ENV} must be 'auto' (the map size chosen per batch step) or unset (the "
                              f"map as it is), got {text!r}")
        return True
    config = configured()
    return config is not None and config.token_map_size == "auto"


CONTEXT_ROWS_ENV = "FRSPEC_CONTEXT_ROWS"
CONTEXT_BUDGET_ENV = "FRSPEC_CONTEXT_BUDGET"
V1_COMPACT_ENV = "FRSPEC_V1_COMPACT"


def v1_compact_path() -> bool:
    """FRSPEC_V1_COMPACT: 1 (default) lets V1 proposers argmax and sample over the kept columns (compact_path.py);
    0 makes them use the full-vocabulary -inf row, as every V2 speculator does (for measuring that row's cost)."""
    text = (os.environ.get(V1_COMPACT_ENV) or "1").strip()
    if text not in ("0", "1"):
        raise FrspecError(f"{V1_COMPACT_ENV} must be 0 or 1, got {text!r}")
    return text == "1"


def token_map_path() -> str | None:
    """The configured token map file, or None (FR-Spec off): FRSPEC_TOKEN_MAP, else FRSPEC_CONFIG's map."""
    explicit = os.environ.get(TOKEN_MAP_ENV)
    if explicit:
        return explicit
    config = configured()
    return config.token_map_path if config is not None else None


def load_configured_map(vocab_size: int) -> TokenMap:
    """The configured map, read for a vocabulary of `vocab_size` ids (formats that record a size must match it)."""
    path = token_map_path()
    assert path is not None, "load_configured_map needs FRSPEC_TOKEN_MAP or FRSPEC_CONFIG with a map"
    return TokenMap.load(path, format=os.environ.get(TOKEN_MAP_FORMAT_ENV) or None, vocab_size=vocab_size)


def speculative_length_mismatch(num_speculative_tokens: int | None) -> str | None:
    """Why vLLM's draft length differs from the configured one (a line to log), or None when it does not."""
    config = configured()
    shape = config.shape if config is not None else None
    if shape is None or num_speculative_tokens is None:
        return None
    where = f"{CONFIG_ENV}={os.environ.get(CONFIG_ENV)}"
    if shape.kind != "chain":
        return (f"{where} was tuned for a {shape} tree, which vLLM's draft_model proposer does not draft; vLLM "
                f"drafts a chain of num_speculative_tokens={num_speculative_tokens}")
    if shape.depth != int(num_speculative_tokens):
        return (f"{where} was tuned for {shape.depth} draft tokens but vLLM's num_speculative_tokens is "
                f"{num_speculative_tokens}; vLLM's value is used (`frspec serve --config` passes the tuned one)")
    return None


def warn_if_length_differs(num_speculative_tokens: int | None) -> None:
    message = speculative_length_mismatch(num_speculative_tokens)
    if message:
        logger.warning("FR-Spec: %s", message)
@dataclass(frozen=True)
class ContextSetting:
    """Context-aware drafting: `extra_rows` rows for the running requests' own tokens under `budget` (see
    frspec.vocab.context_vocab)."""

    extra_rows: int
    budget: str


def context_setting() -> ContextSetting | None:
    """FRSPEC_CONTEXT_ROWS (rows for the requests' tokens; unset or 0: the static map) and FRSPEC_CONTEXT_BUDGET
    (fixed, the default: the rows displace the map's least frequent ones; additive: they come on top)."""
    text = (os.environ.get(CONTEXT_ROWS_ENV) or "").strip()
    budget = (os.environ.get(CONTEXT_BUDGET_ENV) or "fixed").strip()
    if budget not in BUDGETS:
        raise FrspecError(f"{CONTEXT_BUDGET_ENV} must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if not text:
        return None
    try:
        rows = int(text)
    except ValueError:
        raise FrspecError(f"{CONTEXT_ROWS_ENV} must be a non-negative integer, got {text!r}") from None
    if rows < 0:
        raise FrspecError(f"{CONTEXT_ROWS_ENV} must be a non-negative integer, got {rows}")
    return ContextSetting(rows, budget) if rows else None
