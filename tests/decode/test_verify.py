"""The verification rules on hand-made distributions: greedy decisions, and speculative sampling's exactness."""

from __future__ import annotations

import torch

from frspec.decode.sampling import SamplingParams, make_generator, sample
from frspec.decode.token_tree import TokenTree
from frspec.decode.verify import verify
from frspec.decode.verify import verify_sampling as sampling_rule
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap

GREEDY = SamplingParams()
ROOT = 0  # the pending token; its value plays no part in verification


def verify_greedy(target_logits, draft_ids):
    """(accepted drafts, the token after them) for a chain of `draft_ids` (None: vanilla, the root alone)."""
    verdict = verify(TokenTree.chain(ROOT, draft_ids or []), target_logits, GREEDY)
    return verdict.num_accepted, verdict.tokens[-1]


def verify_sampling(target_probs, chain, generator):
    """(accepted drafts, the token after them) when sampling a chain (None: the root alone) against target
    distributions target_probs [n + 1, V]."""
    chain = chain if chain is not None else TokenTree.from_root(ROOT)
    verdict = sampling_rule(chain, target_probs[: len(chain)], generator)
    return verdict.num_accepted, verdict.tokens[-1]


def sampled_chain(token: int, q_full: torch.Tensor) -> TokenTree:
    """A one-draft chain whose token was sampled from q_full (over the target vocabulary)."""
    tree = TokenTree.chain(ROOT, [token])
    tree.child_probs[0] = q_full
    return tree


def _logits_with_argmax(choices: list[int], vocab: int = 10) -> torch.Tensor:
    logits = torch.zeros(len(choices), vocab)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 5.0
    return logits


def _draft(ids: list[int]) -> list[int]:
    return ids


def test_greedy_accepts_the_matching_prefix_then_corrects():
    logits = _logits_with_argmax([4, 7, 2, 9])
    assert verify_greedy(logits, _draft([4, 7, 1])) == (2, 2)
    assert verify_greedy(logits, _draft([4, 7, 2])) == (3, 9)  # all accepted: the bonus token
    assert verify_greedy(logits, _draft([5, 7, 2])) == (0, 4)  # a later match does not count
    assert verify_greedy(logits[:1], None) == (0, 4)


def _chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    exp = probs * counts.sum()
    keep = exp > 0
    assert bool((counts[~keep] == 0).all())
    stat = ((counts[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    return float(torch.special.gammaincc(torch.tensor((int(keep.sum()) - 1) / 2.0, dtype=torch.float64), stat / 2))


def _first_token_counts(verify, p: torch.Tensor, q: torch.Tensor, support: torch.Tensor, n: int) -> torch.Tensor:
    """Draw x ~ q over `support`, verify one draft against p, and count the first emitted token."""
    gen = make_generator(0)
    counts = torch.zeros(p.shape[-1], dtype=torch.float64)
    vocab = DraftVocab.build(torch.zeros(p.shape[-1], 1), token_map=TokenMap(support, p.shape[-1]))
    q_full = vocab.to_full(q)
    for _ in range(n):
        idx = sample(q[None], gen)
        draft = sampled_chain(int(vocab.to_target(idx)), q_full)
        accepted, nxt = verify(p, draft, gen)
        counts[int(support[idx]) if accepted else nxt] += 1
    return counts


def _setup():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 8, generator=gen) * 2, -1)
    top = int(p[0].argmax())
    support = torch.tensor([i for i in range(8) if i != top][:5])  # the map leaves out p's most likely token
    q = torch.softmax(torch.randn(5, generator=gen) * 2, -1)
    return p, q, support


def test_speculative_sampling_with_a_pruned_draft_is_exact():
    p, q, support = _setup()
    counts = _first_token_counts(verify_sampling, p, q, support, 12000)
    assert _chi_square_pvalue(counts, p[0].double()) > 1e-3
    assert counts[int(p[0].argmax())] > 0  # tokens outside the map are produced (by the residual)


def test_the_same_test_rejects_a_wrong_rule():
    p, q, support = _setup()

    def accept_if_q_likes_it(target_probs, draft, generator):
        # Wrong: ignores p at the drafted token, and resamples from p on rejection.
        u = torch.rand(1, generator=generator)
        if float(u) < float(draft.child_probs[0][draft.tokens[1]]) * 2:
            return 1, 0
        return 0, int(sample(target_probs[0], generator))

    counts = _first_token_counts(accept_if_q_likes_it, p, q, support, 12000)
    assert _chi_square_pvalue(counts, p[0].double()) < 1e-6


def test_sampling_with_an_empty_draft_samples_the_target():
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    assert verify_sampling(p, None, make_generator(1)) == (0, 2)


def test_draft_tokens_the_target_rules_out_are_always_rejected():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([0.9, 0.1, 0.0])
    draft = sampled_chain(0, q)
    for seed in range(20):
        assert verify_sampling(p, draft, make_generator(seed)) == (0, 1)
