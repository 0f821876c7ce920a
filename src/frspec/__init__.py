"""frspec: lossless speculative decoding with frequency-ranked (FR-Spec) drafting."""

from frspec.errors import FrspecError

__version__ = "0.1.0"

__all__ = ["FrspecError", "__version__"]
