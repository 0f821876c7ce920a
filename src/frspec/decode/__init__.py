"""Speculative decoding: the engine (`engine`), drafters, verification rules, stats and `frspec generate`."""
