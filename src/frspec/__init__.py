"""frspec: lossless speculative decoding with frequency-ranked (FR-Spec) drafting.

    from frspec import SamplingParams, TokenMap, TreeShape, build_generator, load_model, load_tokenizer

Names are imported on first use, so `import frspec` (and the CLI's help) does not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from frspec.errors import FrspecError

__version__ = "0.1.0"

# Public name -> the module that owns it.
_EXPORTS = {
    "load_model": "frspec.models.loading",
    "load_tokenizer": "frspec.models.tokenizer",
    "load_eagle_head": "frspec.models.eagle_loading",
    "build_generator": "frspec.decode.factory",
    "SpeculativeGenerator": "frspec.decode.engine",
    "SamplingParams": "frspec.decode.sampling",
    "TreeShape": "frspec.decode.tree_shape",
    "GenerationStats": "frspec.decode.stats",
    "TokenMap": "frspec.vocab.token_map",
    "DraftVocab": "frspec.vocab.draft_vocab",
}

__all__ = sorted(["FrspecError", "__version__", *_EXPORTS])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'frspec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
