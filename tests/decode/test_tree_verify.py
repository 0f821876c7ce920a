"""Tree verification: greedy identity, and the exactness of recursive rejection over siblings, checked statistically."""

from collections import Counter
from functools import lru_cache

import pytest
import torch

from frspec.decode.sampling import SamplingParams, logits_to_probs, sample
from frspec.decode.token_tree import TokenTree
from frspec.decode.tree_growth import grow_tree
from frspec.decode.tree_shape import TreeShape
from frspec.decode.verify import Verdict as TreeVerdict
from frspec.decode.verify import verify as verify_tree
from frspec.decode.verify import verify_greedy as verify_tree_greedy
from frspec.decode.verify import verify_sampling as verify_tree_sampling
from frspec.vocab.draft_vocab import DraftVocab

V = 5
IDENTITY = DraftVocab.build(torch.zeros(V, 1))  # draft index i is target id i


def path_seed(path: tuple[int, ...]) -> int:
    return sum((t + 1) * (V + 1) ** i for i, t in enumerate(path))


@lru_cache(maxsize=None)
def target_logits_at(path: tuple[int, ...]) -> torch.Tensor:
    """The tiny 'target': its logits after a path are a fixed random function of that path."""
    gen = torch.Generator().manual_seed(path_seed(path))
    return torch.randn(V, generator=gen) * 1.5


@lru_cache(maxsize=None)
def draft_logits_at(path: tuple[int, ...]) -> torch.Tensor:
    """A drafter that roughly agrees with the target (so acceptance is neither rare nor certain)."""
    gen = torch.Generator().manual_seed(path_seed(path) + 1_000_003)
    return target_logits_at(path) + torch.randn(V, generator=gen)


def node_path(tree: TokenTree, node: int) -> tuple[int, ...]:
    return tuple(tree.tokens[i] for i in tree.path_to(node))


def target_logits_for(tree: TokenTree) -> torch.Tensor:
    return torch.stack([target_logits_at(node_path(tree, n)) for n in range(len(tree))])


def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
    return torch.stack([draft_logits_at(node_path(tree, n)) for n in nodes])


def grow(root: int, shape: TreeShape, params: SamplingParams, gen: torch.Generator) -> TokenTree:
    return grow_tree(root, draft_logits_at((root,)), shape, expand, params, gen, vocab=IDENTITY)


# --- greedy --------------------------------------------------------------------------------------------------------


def greedy_rollout(root: int, n: int) -> list[int]:
    path, out = (root,), []
    for _ in range(n):
        out.append(int(target_logits_at(path).argmax()))
        path += (out[-1],)
    return out


def test_greedy_hand_made_tree():
    tree = TokenTree.from_parents([0, 1, 2, 3], [-1, 0, 0, 2])
    logits = torch.full((4, V), -1.0)
    logits[0, 2] = logits[2, 1] = logits[3, 4] = 5.0
    logits[1, 0] = 5.0
    verdict = verify_tree_greedy(tree, logits)
    assert verdict == TreeVerdict(path=[0, 2], tokens=[2, 1]) and verdict.num_accepted == 1


@pytest.mark.parametrize("seed", range(30))
def test_greedy_equals_the_target_rollout_and_is_longest(seed):
    # Random trees where each child is the target's argmax half of the time, so paths of every length occur.
    gen = torch.Generator().manual_seed(seed)
    root = int(torch.randint(V, (1,), generator=gen))
    tree = TokenTree.from_root(root)
    for _ in range(10):
        parent = int(torch.randint(len(tree), (1,), generator=gen))
        best = int(target_logits_at(node_path(tree, parent)).argmax())
        tok = best if torch.rand((), generator=gen) < 0.5 else int(torch.randint(V, (1,), generator=gen))
        tree.add_child(parent, tok)
    verdict = verify_tree(tree, target_logits_for(tree), SamplingParams())
    assert verdict.tokens == greedy_rollout(root, len(verdict.tokens))
    assert [tree.tokens[i] for i in verdict.path[1:]] == verdict.tokens[:-1]
    assert all(tree.parents[b] == a for a, b in zip(verdict.path, verdict.path[1:]))
    # Longest: no child of the last accepted node carries the target's next token.
    assert all(tree.tokens[c] != verdict.tokens[-1] for c in tree.children(verdict.path[-1]))


def test_verify_tree_checks_row_count():
    with pytest.raises(ValueError):
        verify_tree(TokenTree.chain(0, [1]), torch.zeros(3, V), SamplingParams())


# --- sampling: the first two emitted tokens must follow the target's exact joint law ----------------------------------

ROOT = 2
N_SAMPLES = 6000


def exact_joint(params: SamplingParams) -> torch.Tensor:
    p1 = logits_to_probs(target_logits_at((ROOT,)), params).double()
    joint = torch.zeros(V, V, dtype=torch.float64)
    for a in range(V):
        joint[a] = p1[a] * logits_to_probs(target_logits_at((ROOT, a)), params).double()
    return joint


def empirical_joint(params, shape, verifier, seed=0) -> torch.Tensor:
    """Run grow + verify N_SAMPLES times; when a step emits one token, the second comes from the target itself
    (which is what the next step's first token is, as the single-level case checks)."""
    gen = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(N_SAMPLES):
        tree = grow(ROOT, shape, params, gen)
        probs = logits_to_probs(target_logits_for(tree), params)
        tokens = verifier(tree, probs, gen).tokens
        if len(tokens) == 1:
            tokens.append(int(sample(logits_to_probs(target_logits_at((ROOT, tokens[0])), params), gen)))
        counts[(tokens[0], tokens[1])] += 1
    joint = torch.zeros(V, V, dtype=torch.float64)
    for (a, b), c in counts.items():
        joint[a, b] = c
    return joint


def chi_square_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    n = float(observed.sum())
    support = expected_probs > 0
    assert float(observed[~support].sum()) == 0, "a token the target never emits was emitted"
    exp = expected_probs[support] * n
    stat = float(((observed[support] - exp) ** 2 / exp).sum())
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


SAMPLING_CASES = {
    "chain": (SamplingParams(temperature=1.0), TreeShape.chain(2)),
    "static": (SamplingParams(temperature=1.0), TreeShape.static(2, 2)),
    "static-topk-topp": (SamplingParams(temperature=0.8, top_k=4, top_p=0.9), TreeShape.static(2, 3)),
    "dynamic": (SamplingParams(temperature=1.0), TreeShape.dynamic(depth=3, topk=2, budget=5)),
}


@pytest.mark.parametrize("case", SAMPLING_CASES)
def test_tree_sampling_is_exact(case):
    params, shape = SAMPLING_CASES[case]
    observed = empirical_joint(params, shape, verify_tree_sampling)
    assert chi_square_pvalue(observed, exact_joint(params)) > 1e-3


def test_tree_sampling_accepts_drafts():
    # Exactness alone is met by ignoring the tree; check the trees are actually used.
    params, shape = SAMPLING_CASES["static"]
    gen = torch.Generator().manual_seed(1)
    accepted = [
        verify_tree_sampling(t, logits_to_probs(target_logits_for(t), params), gen).num_accepted
        for t in (grow(ROOT, shape, params, gen) for _ in range(300))
    ]
    assert sum(accepted) / len(accepted) > 0.8 and max(accepted) == 2


# Negative controls: plausible-looking rules that are wrong must fail the same test, or the test has no power.


def verify_ignoring_without_replacement(tree, target_probs, gen):
    """Wrong: treats siblings drawn without replacement as if each were drawn from the unchanged q."""
    tree = TokenTree(tree.tokens, tree.parents, tree.depths, dict(tree.child_probs))
    node, path, tokens = 0, [0], []
    while True:
        p, q = target_probs[node].double(), tree.child_probs.get(node)
        for child in tree.children(node):
            x = tree.tokens[child]
            r = q.double() if q is not None else torch.nn.functional.one_hot(torch.tensor(x), V).double()
            if float(torch.rand((), generator=gen)) * float(r[x]) < float(p[x]):
                break
            res = (p - r).clamp(min=0)
            p = res / res.sum() if res.sum() > 0 else p
        else:
            return TreeVerdict(path, tokens + [int(sample(p, gen))])
        path.append(child)
        tokens.append(x)
        node = child


def verify_resampling_from_p(tree, target_probs, gen):
    """Wrong: after every sibling is rejected, draws from the target's p instead of the residual."""
    verdict = verify_tree_sampling(tree, target_probs, gen)
    last = verdict.path[-1]
    rejected_all = len(verdict.tokens) == len(verdict.path) and tree.children(last)
    if rejected_all:
        verdict.tokens[-1] = int(sample(target_probs[last], gen))
    return verdict


@pytest.mark.parametrize(
    "wrong, case",
    [(verify_ignoring_without_replacement, "static"), (verify_resampling_from_p, "dynamic")],
)
def test_wrong_rules_fail_the_distribution_test(wrong, case):
    params, shape = SAMPLING_CASES[case]
    observed = empirical_joint(params, shape, wrong)
    assert chi_square_pvalue(observed, exact_joint(params)) < 1e-6
