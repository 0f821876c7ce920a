"""frspec: lossless speculative decoding with frequency-ranked (FR-Spec) drafting."""

from frspec.errors import FrspecError

__version__ = "0.1.0"

__all__ = ["FrspecError", "TokenMap", "__version__"]


def __getattr__(name: str):
    # Lazy, so `import frspec` (and the CLI's help) does not pay for torch.
    if name == "TokenMap":
        from frspec.vocab.token_map import TokenMap

        return TokenMap
    raise AttributeError(f"module 'frspec' has no attribute {name!r}")
