"""How long answers run: the tokens a request is expected to emit, from the lengths earlier requests of its kind took.

A draft model's prefill over the prompt is paid once and won back token by token, so whether to pay it depends on
how many tokens are left to draft. `max_new_tokens` is only a cap: at temperature 1.0 many answers end long before it.
Measured on the int4 mix at 256 tokens and temperature 1.0 (2-core AMD EPYC, AVX-512, `3aac93a`), 13 of the 30
answers kept (six prompts, five rows) ended within 50 tokens, 8 within 20; `auto` paid a 3.2 s prefill for an 11-token
answer after a 1,005-token prompt and a 4.5 s one for 47 tokens after a 1,309-token one, and ran 0.47x the best static
row on code. A prefill decided at the cap bets on the longest answer; decided at the expected length, it bets on the
ones this workload gives.

    expected_tokens(lengths, emitted, cap)   the tokens a request that has emitted `emitted` still emits, on
                                             average, under a cap of `cap` tokens

from the answers of the last `LENGTH_HISTORY` requests of the kind (`add_answer`) that went on past `emitted`
(an answer that ended earlier says nothing of one still running), each counted to `min(length, cap)`; an answer cut by
its own cap counts as reaching this cap (it might have gone on). One pseudo-answer at the cap weighs as one request, so
with no history the expectation is the cap's (as before) and one short answer halves it at most: a workload whose
answers run to the cap keeps drafting from its first request.
"""

from __future__ import annotations

from dataclasses import dataclass

LENGTH_HISTORY = 16  # answers remembered per kind of request: enough to see a mix of lengths, recent enough to follow


@dataclass(frozen=True)
class AnswerLengths:
    """The last LENGTH_HISTORY answers of one kind of request, oldest first: (tokens emitted, whether its cap cut
    it)."""

    answers: tuple[tuple[int, bool], ...] = ()


def add_answer(lengths: AnswerLengths | None, tokens: int, capped: bool) -> AnswerLengths:
    """`lengths` with one more answer of `tokens` tokens (`capped`: it ended at its max_new_tokens, not by itself)."""
    answers = (lengths.answers if lengths is not None else ()) + ((int(tokens), bool(capped)),)
    return AnswerLengths(answers[-LENGTH_HISTORY:])


def expected_tokens(lengths: AnswerLengths | None, emitted: int, cap: int) -> float:
    """The tokens a request that has emitted `emitted` of at most `cap` is expected to emit still (module docstring)."""
    left = max(cap - emitted, 0)
    total, count = float(left), 1  # the pseudo-answer at the cap
    for tokens, capped in lengths.answers if lengths is not None else ():
        if tokens <= emitted and not capped:
            continue  # ended before this point: not a request like this one
        total += left if capped else min(tokens, cap) - emitted
        count += 1
    return total / count
