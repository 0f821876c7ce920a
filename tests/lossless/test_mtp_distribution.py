"""End to end: sampled generations drafted by MTP layers follow the target's joint law (test_engine_distribution.py's
check, on tiny checkpoints in the published MTP layouts of mtp_tiny.py).

Cases: a DeepSeek-V3 MoE target drafted by its MTP layer as a chain through an FR-Spec map (the sampled chain is
`grow_tree` with one child per node, recursive below the first draft), and a Qwen3.5 hybrid target (Gated DeltaNet
layers, decode/hybrid_target.py) drafted as a static tree, so sampled verification restores linear-attention states
at accepted and rejected nodes. Each sample is one `generate(max_new_tokens=4)` with its own seed; (x2, x3) is
decided by a speculative step. Reference: P(x2, x3) = sum_x1 p(x1) p(x2|x1) p(x3|x1 x2) from the target's own
logits through transformers' processors. Power: enough samples that a total variation of E2E_TV = 0.1 is
detected with power 0.9 at alpha 1e-3 over the reference's live cells (asserted), as in test_engine_distribution.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.lossless.decode_adapter import TreeShape, build_generator, sample_second_and_third
from frspec.models.mtp import load_mtp_head
from frspec.vocab.token_map import TokenMap
from tests.lossless.lossless_power import E2E_TV, check_distribution
from tests.lossless.lossless_reference import target_joint_after_prompt
from tests.lossless.lossless_sampling import SCALE, e2e_sample_size
from tests.decode.mtp_tiny import load_target, save_mtp_checkpoint

V = 16
PROMPT = [3, 9, 1]
T, K, P = 0.9, 6, 0.95
CASES = {
    "deepseek_v3-mtp+map-chain": ("deepseek_v3", dict(token_map=TokenMap([0, 2, 3, 5, 6, 8, 9, 11, 12, 15], V),
                                                      num_spec_tokens=2)),
    "qwen3_5-hybrid-mtp-static": ("qwen3_5", dict(tree=TreeShape.static(2, 2))),
}



@pytest.mark.lossless_heavy
@pytest.mark.parametrize("name", list(CASES))
def test_mtp_samples_follow_the_target(tmp_path, name):
    family, options = CASES[name]
    path = save_mtp_checkpoint(tmp_path / family, family, vocab=V)
    target = load_target(path)
    with torch.no_grad():  # sharper next-token laws than the random head's, so drafts are often accepted
        target.get_output_embeddings().weight.mul_(2.0)
    generator = build_generator(target, eagle=load_mtp_head(target, path), **options)
    reference = target_joint_after_prompt(target, PROMPT, V, T, K, P)
    n = e2e_sample_size(reference)
    counts, accepted = sample_second_and_third(generator, PROMPT, n, V, dict(temperature=T, top_k=K, top_p=P))
    assert accepted > n // 4, "drafts must be accepted often enough for the check to test speculation"
    tv = check_distribution(counts, reference, f"engine {name}")
    if SCALE >= 1:
        assert tv <= E2E_TV, tv
