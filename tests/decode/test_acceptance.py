"""Expected acceptance of sampled chain steps (decode/acceptance.py): its values, and that it has the controller's
accept/reject counts' expectation (a Monte Carlo check against the real verifier)."""

from __future__ import annotations

import math

import torch

from frspec.decode.acceptance import drawn_acceptance, expected_acceptance
from frspec.decode.sampling import SamplingParams
from frspec.decode.token_tree import TokenTree
from frspec.decode.verify import verify

V = 12
INSIDE = torch.arange(V) < 8  # the rows drafted from: the first 8 ids
T1 = SamplingParams(temperature=1.0)


def chain(tokens, probs):
    tree = TokenTree.from_root(tokens[0])
    for i, x in enumerate(tokens[1:]):
        tree.add_child(i, x)
    tree.child_probs.update({i: q for i, q in enumerate(probs)})
    return tree


def test_drawn_acceptance_is_the_verifiers_test_of_the_drawn_token_and_averages_to_the_overlap():
    """min(1, p(x) / q(x)) for the drafted x; over x ~ q it averages to beta = sum min(p, q) exactly (so it is the
    same evidence as expected_acceptance, about the very token drawn); greedy: 1 for the target's argmax, else 0."""
    q, logits = drafts(torch.Generator().manual_seed(3))
    p = torch.softmax(logits.double(), -1)
    averaged = 0.0
    for x in range(V):
        if q[0][x] == 0:
            continue
        tree = chain([0, x, 5], [q[0], q[1]])
        drawn = drawn_acceptance(tree, logits, [0, 1, 2], T1)
        assert len(drawn) == 2 and drawn_acceptance(tree, logits, [0], T1) == drawn[:1]
        assert math.isclose(drawn[0], min(1.0, float(p[0][x] / q[0][x].double())), rel_tol=1e-6)
        averaged += float(q[0][x]) * drawn[0]
    assert math.isclose(averaged, float(torch.minimum(p[0], q[0].double()).sum()), rel_tol=1e-6)
    best = int(logits[0].argmax())
    assert drawn_acceptance(chain([0, best], []), logits[:2], [0, 1], SamplingParams()) == [1.0]
    assert drawn_acceptance(chain([0, (best + 1) % V], []), logits[:2], [0], SamplingParams()) == [0.0]
    tree = chain([0, 3], [q[0]])
    tree.add_child(0, 7)  # a second child at the root: not a chain
    assert drawn_acceptance(tree, torch.cat([logits, logits[:1]]), [0], T1) is None


def drafts(gen):
    """Two draft distributions that are zero outside INSIDE, and the target's logits at three chain nodes."""
    q = torch.rand(2, V, generator=gen) * INSIDE
    return q / q.sum(-1, keepdim=True), torch.randn(3, V, generator=gen) * 1.5


def test_values_are_the_overlap_and_the_target_mass_inside_the_rows():
    q, logits = drafts(torch.Generator().manual_seed(0))
    p = torch.softmax(logits.double(), -1)
    tree = chain([0, 3, 5], [q[0], q[1]])
    full = expected_acceptance(tree, logits, [0, 1, 2], T1, INSIDE)  # both accepted: two nodes with a child
    rejected_first = expected_acceptance(tree, logits, [0], T1, INSIDE)
    for i, (beta, mass) in enumerate(full):
        assert math.isclose(beta, float(torch.minimum(p[i], q[i].double()).sum()), rel_tol=1e-6)
        assert math.isclose(mass, float(p[i][INSIDE].sum()), rel_tol=1e-6)
        assert 0.0 < beta < mass < 1.0
    assert len(full) == 2 and rejected_first == full[:1]
    assert expected_acceptance(tree, logits, [0, 1], T1, None)[1][1] == 1.0  # no rows given: all inside
    assert expected_acceptance(tree, logits, [0, 1], SamplingParams(), INSIDE) is None  # greedy: not needed
    tree.add_child(0, 7)  # a second child at the root: not a chain
    assert expected_acceptance(tree, torch.cat([logits, logits[:1]]), [0], T1, INSIDE) is None
    argmax_child = chain([0, 3], [])  # a deterministic child: accepted with the target's probability of it
    beta = expected_acceptance(argmax_child, logits[:2], [0], T1, INSIDE)[0][0]
    assert math.isclose(beta, float(p[0][3]), rel_tol=1e-6)


def test_it_has_the_expectation_of_the_controllers_accept_reject_counts():
    """The controller counts, per reached position, agreed 1/tried 1 on acceptance and agreed 0/tried [the
    target's token is inside the rows] on rejection. Over N sampled steps through the real verifier, their sums
    must match the sums of (beta, mass) within 4 standard errors (each count is in [0, 1], so its variance is
    at most 1/4). A wrong mass (say 1, ignoring the rows) is off by N * (1 - mass) ~ 1000 here, 30 standard errors."""
    gen = torch.Generator().manual_seed(1)
    q, logits = drafts(gen)
    n = 4000
    counted = torch.zeros(2, 2, dtype=torch.float64)  # [position, (agreed, tried)]
    expected = torch.zeros(2, 2, dtype=torch.float64)
    reached = [0, 0]
    for _ in range(n):
        xs = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        tree = chain([0, *xs], [q[0], q[1]])
        verdict = verify(tree, logits, T1, gen)
        for i in range(min(verdict.num_accepted + 1, 2)):
            reached[i] += 1
            accepted = i < verdict.num_accepted
            counted[i] += torch.tensor([float(accepted), float(accepted or bool(INSIDE[verdict.tokens[i]]))])
        for i, pair in enumerate(expected_acceptance(tree, logits, verdict.path, T1, INSIDE)):
            expected[i] += torch.tensor(pair, dtype=torch.float64)
    assert reached[1] > n // 4  # the second position is exercised too
    for i in range(2):
        bound = 4 * math.sqrt(reached[i] / 4)
        assert torch.all((counted[i] - expected[i]).abs() < bound), (i, counted[i], expected[i], bound)
    assert (n - expected[0, 1]) > 10 * bound  # the rows matter here: mass is well below 1
