"""`llama.cpp vanilla`: the same GGUF decoded greedily by llama.cpp (llama-cpp-python), as a benchmark peer.

Optional: `pip install -e '.[llamacpp]'` builds llama.cpp from source (cmake; a few minutes on 2 cores; set
CMAKE_ARGS="-DGGML_NATIVE=ON" for this CPU's instructions). It gets the same prompt token ids and token budget as
frspec's rows and runs greedy (temperature 0, no repetition penalty), and its timing is split the same way:
prefill (prompt and first token) apart, decoding throughput = tokens after the first / the time they took.

llama-cpp-python 0.3.36's Python API has no draft-model speculation: `Llama(draft_model=...)` takes only a
`LlamaDraftModel`, whose one implementation is prompt-lookup decoding (`LlamaPromptLookupDecoding`, n-grams from
the prompt). So there is no `llama.cpp speculative` row; llama.cpp's own `llama-speculative` binary with the 0.5B
draft measured 19.2 tokens/s against 39.1 vanilla on this machine (issue 12).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from frspec.errors import FrspecError
from frspec.decode.stats import GenerationStats

LABEL = "llama.cpp vanilla"
INSTALL_HINT = "pip install -e '.[llamacpp]' (builds llama.cpp; CMAKE_ARGS=-DGGML_NATIVE=ON for a native CPU build)"


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def gguf_file(spec: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The GGUF file behind a model spec: a `.gguf` path as is, a default model's GGUF assembled from its
    packages into the cache (kept there, checked by size and SHA-256 on each use)."""
    from frspec.models.cache import cache_root
    from frspec.models.defaults import DEFAULT_MODELS, ROLES, assemble_gguf, is_intact_gguf

    name = ROLES.get(spec, spec)
    if name in DEFAULT_MODELS:
        model = DEFAULT_MODELS[name]
        path = cache_root(cache_dir) / "gguf" / model.gguf_name
        if not is_intact_gguf(model, path):
            assemble_gguf(model, path)
        return path
    path = Path(spec).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise FrspecError(f"the llama.cpp row needs a GGUF file or a default model, got {spec!r}")
    return path


class LlamaCppGreedy:
    """One llama.cpp model decoding greedily from token ids."""

    def __init__(self, gguf_path: str | os.PathLike, threads: int, n_ctx: int = 4096, repack: bool = True,
                 logits_all: bool = False):
        """`repack=False` turns off llama.cpp's "extra buffer types" (weights repacked for its AMX or AVX
        interleaved kernels): the escape hatch for a build whose AMX path a VM cannot run (SIGILL), at some cost
        to llama.cpp's speed. `logits_all` keeps every position's logits, for `teacher_forced_logits`."""
        if not available():
            raise FrspecError(f"the llama.cpp row needs llama-cpp-python: {INSTALL_HINT}")
        import llama_cpp.llama as llama_module
        from llama_cpp import Llama

        defaults = llama_module.llama_cpp.llama_model_default_params

        def params():
            p = defaults()
            p.use_extra_bufts = repack
            return p

        llama_module.llama_cpp.llama_model_default_params = params  # Llama() reads its model params from here
        try:
            self.llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                             n_batch=512, logits_all=logits_all, verbose=False)
        finally:
            llama_module.llama_cpp.llama_model_default_params = defaults

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int],
                                                                                                    GenerationStats]:
        """Greedy tokens (a final EOS included, as frspec counts it) and frspec-style stats for them."""
        self.llm.reset()
        tokens: list[int] = []
        start = time.perf_counter()
        first = None
        for token in self.llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                       repeat_penalty=1.0, reset=True):
            if first is None:
                first = time.perf_counter()
            tokens.append(int(token))
            if token in eos_ids or len(tokens) >= max_new_tokens:
                break
        end = time.perf_counter()
        n = len(tokens)
        stats = GenerationStats(
            prompt_tokens=len(prompt_ids), tokens=n, decode_tokens=max(n - 1, 0), target_forwards=max(n - 1, 0),
            prefill_time_s=(first or end) - start, target_time_s=end - (first or end), wall_time_s=end - start,
        )
        return tokens, stats

    def teacher_forced_logits(self, ids: Sequence[int]):
        """[len(ids), vocab] float32 numpy logits of the next token after each prefix of `ids`, from one
        evaluation of them (needs logits_all=True and len(ids) <= n_ctx)."""
        import numpy as np

        self.llm.reset()
        self.llm.eval(list(ids))
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)
