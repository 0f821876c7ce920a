"""Lossless speculative decoding: drafters propose token trees, one verifier decides, one step runs them.

Read in this order: sampling.py (SamplingParams, the one sampler), token_tree.py (TokenTree: what is drafted),
tree_shape.py (TreeShape: how big), tree_growth.py (how a drafter grows one), drafter.py / draft_model.py /
eagle_drafter.py (who drafts), verify.py (the one verifier), kv_cache.py (the one cache surgery), step.py (the one
decode step), engine.py (the loop), request.py, stopping.py, stats.py, factory.py (build_generator).
"""
