"""FR-Spec's logits processor without vLLM, on drafters shaped like vLLM's MTP models whose compute_logits takes
`spec_step_idx` (DeepSeek-V3 / GLM / MiMo-V2-style: a norm and a head per MTP layer; Qwen3.5 / Qwen3-Next-style:
one head, the index ignored). These MTP types cannot run on vLLM's CPU build (MLA, MoE kernels, hybrid linear
attention), so their calling convention is covered here: each step's logits are the map rows' scores of the head
that step calls, after the model's own norm, -inf elsewhere, in a buffer reused for its shape."""

import torch
from torch import nn

from frspec.vllm_plugin.drafter_head import build_drafter_head
from frspec.vllm_plugin.pruned_logits import PrunedLogits, pruned_logits_of
from frspec.vllm_plugin.worker_check import probe_steps
from frspec.vocab.token_map import TokenMap

V, H = 80, 12
MAP = [3, 9, 10, 11, 40, 79, 0]


class Processor(nn.Module):
    """vLLM's LogitsProcessor, reduced to its call: lm_head(hidden)."""

    def forward(self, lm_head, hidden, embedding_bias=None):
        return hidden @ lm_head.weight.T


class SharedHead(nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.norm = nn.LayerNorm(H)
        self.head = nn.Module()
        self.head.weight = nn.Parameter(torch.randn(V, H, generator=g))

    def forward(self, hidden):
        return self.norm(hidden)


class MultiLayerMTP(nn.Module):
    """DeepSeekMultiTokenPredictor.compute_logits: the step's layer normalises, then its own shared head."""

    def __init__(self, n_layers=2):
        super().__init__()
        self.layers = nn.ModuleList(SharedHead(seed) for seed in range(n_layers))
        self.logits_processor = Processor()

    def compute_logits(self, hidden_states, spec_step_idx: int = 0):
        layer = self.layers[spec_step_idx % len(self.layers)]
        return self.logits_processor(layer.head, layer(hidden_states))


class OneHeadMTP(nn.Module):
    """Qwen3_5MTP.compute_logits: spec_step_idx accepted and ignored."""

    def __init__(self):
        super().__init__()
        self.lm_head = SharedHead(7).head
        self.logits_processor = Processor()

    def compute_logits(self, hidden_states, spec_step_idx: int = 0):
        return self.logits_processor(self.lm_head, hidden_states)


def _install(model):
    token_map = TokenMap(MAP, V)
    built = []

    def build(lm_head, processor):
        built.append(lm_head)
        return build_drafter_head(lm_head.weight.detach(), token_map, V, V)

    model.logits_processor = PrunedLogits(model.logits_processor, build)
    return built


def _expected(hidden, weight):
    out = torch.full((hidden.shape[0], V), float("-inf"))
    out[:, MAP] = hidden @ weight[MAP].T
    return out


def test_each_mtp_step_scores_its_own_heads_map_rows_after_its_own_norm():
    model = MultiLayerMTP()
    built = _install(model)
    hidden = torch.randn(3, H)
    for step in range(5):  # recursive MTP: more steps than layers, the layers are reused
        layer = model.layers[step % 2]
        got = model.compute_logits(hidden, spec_step_idx=step)
        torch.testing.assert_close(got, _expected(layer(hidden).detach(), layer.head.weight.detach()))
    assert len(built) == 2, "one pruned copy per distinct head, built once"
    assert pruned_logits_of(model) == [model.logits_processor]


def test_a_one_head_mtp_ignores_the_step_and_keeps_the_head_untouched():
    model = OneHeadMTP()
    weight = model.lm_head.weight.detach().clone()
    _install(model)
    hidden = torch.randn(2, H)
    for step in range(3):
        torch.testing.assert_close(model.compute_logits(hidden, spec_step_idx=step), _expected(hidden, weight))
    assert torch.equal(model.lm_head.weight, weight)
    assert model.logits_processor.heads[id(model.lm_head)].vocab.head.weight.data_ptr() != weight.data_ptr()


def test_the_output_buffer_is_reused_per_shape_and_refilled():
    model = OneHeadMTP()
    _install(model)
    hidden = torch.randn(2, H)
    first = model.compute_logits(hidden)
    first_ptr = first.data_ptr()
    first.zero_()  # a sampler scaling or overwriting the logits in place
    again = model.compute_logits(hidden)
    assert again.data_ptr() == first_ptr, "same shape: the same preallocated output"
    torch.testing.assert_close(again, _expected(hidden, model.lm_head.weight.detach()))
    assert model.compute_logits(torch.randn(5, H)).data_ptr() != first_ptr


def test_the_workers_probe_covers_every_draft_step_when_logits_depend_on_it():
    assert probe_steps(MultiLayerMTP(), 3) == [{"spec_step_idx": 0}, {"spec_step_idx": 1}, {"spec_step_idx": 2}]

    class Plain(nn.Module):
        def compute_logits(self, hidden_states):
            return hidden_states

    assert probe_steps(Plain(), 3) == [{}]


def test_the_pruned_logits_trace_as_one_graph():
    """Graph-safe: torch.compile(fullgraph=True) refuses any graph break (a host sync such as .item(), a branch on
    tensor values); the traced function gives the eager result and keeps writing into the one buffer per shape."""
    from frspec.vllm_plugin.drafter_head import build_drafter_head

    weight = torch.randn(V, H)
    head = build_drafter_head(weight, TokenMap(MAP, V), V, V)
    compiled = torch.compile(head.row_logits, fullgraph=True, backend="eager")
    hidden = torch.randn(4, H)
    first = compiled(hidden)
    torch.testing.assert_close(first, _expected(hidden, weight))
    ptr = first.data_ptr()
    hidden = torch.randn(4, H)
    second = compiled(hidden)
    torch.testing.assert_close(second, _expected(hidden, weight))
    assert second.data_ptr() == ptr


def test_a_16_bit_head_on_cpu_returns_its_exact_scores_in_an_fp32_row():
    """CPU's argmax over a bf16 row is not vectorised, so the full row is fp32 there: every kept score is the bf16
    score widened exactly (not recomputed in fp32), -inf elsewhere, and its argmax is the bf16 row's, ties included
    (a bf16 tie stays a tie; both take the first maximum)."""
    from frspec.vllm_plugin.drafter_head import build_drafter_head, row_dtype

    assert row_dtype(torch.bfloat16, torch.device("cpu")) == torch.float32
    assert row_dtype(torch.float16, torch.device("cpu")) == torch.float32
    assert row_dtype(torch.float32, torch.device("cpu")) == torch.float32
    assert row_dtype(torch.bfloat16, torch.device("cuda")) == torch.bfloat16, "GPU rows keep the logits' dtype"
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(V, H, generator=g) * 0.1).to(torch.bfloat16)
    weight[40] = weight[9] = 1.0  # two kept rows tied at the top for a positive hidden state
    head = build_drafter_head(weight, TokenMap(MAP, V), V, V)
    hidden = torch.rand(3, H, generator=g).to(torch.bfloat16) + 1
    kept = head.kept_logits(hidden)
    assert kept.dtype == torch.bfloat16
    row = head.row_logits(hidden)
    assert row.dtype == torch.float32 and row.shape == (3, V)
    assert torch.equal(row[:, MAP], kept.float())
    outside = torch.ones(V, dtype=torch.bool)
    outside[MAP] = False
    assert bool(torch.isneginf(row[:, outside]).all())
    bf16_row = torch.full((3, V), float("-inf"), dtype=torch.bfloat16).index_copy_(1, torch.tensor(MAP), kept)
    assert torch.equal(row[:, 9], row.max(-1).values) and torch.equal(row[:, 9], row[:, 40]), "the tie is the top"
    assert row.argmax(-1).tolist() == bf16_row.argmax(-1).tolist() == [9, 9, 9]
    assert row.data_ptr() == head.row_logits(hidden).data_ptr(), "the fp32 row is allocated once per shape"
