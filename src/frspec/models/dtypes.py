"""The one table of model dtypes: the names commands accept and reports print. Its own module (torch only) so the
command line can list the choices without importing transformers."""

from __future__ import annotations

import torch

from frspec.errors import FrspecError

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp64": torch.float64,
    "float64": torch.float64,
    "double": torch.float64,
}
HALF_DTYPES = (torch.float16, torch.bfloat16)
# The short name of each model dtype: what commands accept (besides "auto") and reports print.
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype) -> str:
    """"bf16", "fp16", "fp32" or "fp64" (another dtype: its torch name)."""
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype | None:
    """A torch dtype for a name like "bf16"/"fp32" or a torch float dtype; None for "auto" (decided per model)."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise FrspecError(f"model dtype must be a floating-point type, got {dtype}")
        return dtype
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name == "auto":
        return None
    if name not in DTYPES:
        raise FrspecError(f"unknown dtype {dtype!r}: use auto, bf16, fp16, fp32 or fp64")
    return DTYPES[name]
