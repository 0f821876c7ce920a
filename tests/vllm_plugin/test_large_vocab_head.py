"""The plugin's FR-Spec head at the largest vocabularies the open families ship, without vLLM: Qwen3.5's 248,320 ids
(its MTP layer shares the target's LM head) and Gemma 3's 262,144 (a Gemma 3 draft model's tied head), pruned to a
32k map read the way the plugin reads it (FRSPEC_TOKEN_MAP). The logits vLLM's drafter gets are -inf outside the map
and exactly the full head's inside, on one rank and gathered over tensor-parallel ranks.

A small hidden size keeps it fast; integer-valued weights and hidden states make every dot product exact in fp32 and
bf16, so "exact" is torch.equal against the full head, whatever order a kernel sums in."""

import pytest
import torch
from torch import nn

from frspec.vllm_plugin.drafter_head import build_drafter_head, row_dtype
from frspec.vllm_plugin.pruned_logits import PrunedLogits
from frspec.vllm_plugin.settings import TOKEN_MAP_ENV, load_configured_map
from frspec.vocab.token_map import TokenMap

VOCABS = {"qwen3.5": 248_320, "gemma3": 262_144}
K, H, N = 32_768, 8, 5


def _map_ids(vocab: int) -> torch.Tensor:
    """K distinct ids in no particular order, the last id and id 0 first (the edges of the head)."""
    g = torch.Generator().manual_seed(vocab)
    rest = torch.randperm(vocab - 2, generator=g)[: K - 2] + 1
    return torch.cat([torch.tensor([vocab - 1, 0]), rest])


def _ints(*shape: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


class Processor(nn.Module):
    """vLLM's LogitsProcessor, reduced to its call: lm_head(hidden)."""

    def forward(self, lm_head, hidden, embedding_bias=None):
        return hidden @ lm_head.weight.T


class SharedHeadDrafter(nn.Module):
    """A drafter whose compute_logits calls the processor on one LM head (Qwen3.5's MTP model sharing the target's
    head, its `spec_step_idx` ignored; a Gemma 3 draft model's tied head)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.lm_head = nn.Module()
        self.lm_head.weight = nn.Parameter(weight, requires_grad=False)
        self.logits_processor = Processor()

    def compute_logits(self, hidden_states, spec_step_idx: int = 0):
        return self.logits_processor(self.lm_head, hidden_states)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fmt", ["frspec", "thunlp"])
@pytest.mark.parametrize("family", list(VOCABS))
def test_a_32k_map_of_the_largest_heads_gives_exact_logits_inside_and_neg_inf_outside(
        family, fmt, dtype, tmp_path, monkeypatch):
    vocab = VOCABS[family]
    ids = _map_ids(vocab)
    path = tmp_path / ("map.pt" if fmt == "thunlp" else "map.frspec")
    TokenMap(ids, vocab).save(path)
    monkeypatch.setenv(TOKEN_MAP_ENV, str(path))
    weight = _ints(vocab, H, seed=1, dtype=dtype)
    model = SharedHeadDrafter(weight.clone())
    built = []

    def build(lm_head, processor):  # as drafter_hook.head_for: the configured map, read for the model's vocabulary
        built.append(build_drafter_head(lm_head.weight.detach(), load_configured_map(vocab), vocab, vocab))
        return built[-1]

    model.logits_processor = PrunedLogits(model.logits_processor, build)
    hidden = _ints(N, H, seed=2, dtype=dtype)
    full = (hidden.float() @ weight.float().T)  # the full head's logits, exact (small integers)
    for step in range(3):
        got = model.compute_logits(hidden, spec_step_idx=step)
        # The row's dtype is row_dtype's: a 16-bit row is widened to fp32 on CPU (exactly; the values are checked below).
        assert got.shape == (N, vocab) and got.dtype == row_dtype(dtype, hidden.device)
        assert torch.equal(got[:, ids].float(), full[:, ids]), "inside the map: the full head's logits, exactly"
        outside = torch.ones(vocab, dtype=torch.bool)
        outside[ids] = False
        assert bool(torch.isneginf(got[:, outside]).all()) and int(outside.sum()) == vocab - K
        probs = torch.softmax(got.float(), -1)
        assert bool((probs[:, outside] == 0).all())
        torch.testing.assert_close(probs[:, ids], torch.softmax(full[:, ids], -1))
    head = built[0]
    assert len(built) == 1 and head.size == K and tuple(head.vocab.head.weight.shape) == (K, H)
    assert torch.equal(head.to_target(torch.arange(K)), ids), "kept columns in map order"
    assert torch.equal(model.lm_head.weight, weight), "the shared head is never modified"
    assert head.vocab.head.weight.data_ptr() != model.lm_head.weight.data_ptr(), "the pruned rows are a copy"


def _ranges(n_rows: int, tp: int) -> list[tuple[int, int]]:
    per = -(-n_rows // tp)  # vLLM's equal split (the last shard may be short)
    return [(min(r * per, n_rows), min((r + 1) * per, n_rows)) for r in range(tp)]


@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("family", list(VOCABS))
def test_tensor_parallel_shards_of_the_largest_heads_gather_to_the_exact_map_logits(family, tp):
    """Each rank keeps only the map's rows of its own shard; the all-gathered logits are the one-rank result, which
    is the full head's at the map's ids (the ids are spread over every shard)."""
    vocab = VOCABS[family]
    ids = _map_ids(vocab)
    token_map = TokenMap(ids, vocab)
    weight = _ints(vocab, H, seed=3)
    hidden = _ints(N, H, seed=4)
    ranges = _ranges(vocab, tp)
    heads = [build_drafter_head(weight[lo:hi], token_map, vocab, vocab, ranges, r, all_gather=lambda x: x)
             for r, (lo, hi) in enumerate(ranges)]
    assert sum(h.vocab.size for h in heads) == K and all(h.vocab.size > 0 for h in heads)
    local = [h.local_logits(hidden) for h in heads]
    assert len({x.shape[-1] for x in local}) == 1, "every rank contributes the same width to the all-gather"
    gathered = torch.cat(local, dim=-1)
    expected = (hidden @ weight.T)[:, ids]
    for h in heads:
        assert torch.equal(h.select(gathered), expected)
        assert torch.equal(h.to_target(torch.arange(K)), ids)
