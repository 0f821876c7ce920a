"""The per-request controller: before every decode step, choose the draft length (0: plain decoding) and the map
size k (the full head: no map) from what this request has shown so far and what this machine's steps cost.

What a step shows (the verifier sees the target's token at every position it checks):

    coverage   every emitted token is the target's token; its rank in the drafter's ranked head
               (vocab/ranked_vocab.py) says at once which map sizes held it. So the share c(k) of the target's
               tokens inside the first k rows is observed for every k at each step, whatever k was drafted with.
    agreement  at each drafted position the step reached, whether the draft matched the target, counted only where
               the target's token was inside the rows drafted from (a token outside them is the map's miss, not
               the draft's): per position i, alpha_i = P(draft agrees | its rows held the target's token).

A chain position is then accepted with probability alpha_i * c(k), and a step of depth d expects E(d, k) = 1 +
sum_{j=1..d} prod_{i<j} alpha_i c(k) tokens for `StepCosts.step_time_s(d, k, L)` seconds (decode/step_costs.py, the
model `frspec tune` predicts with), read at the request's current context L (prompt and generated tokens, in steps of
`CONTEXT_STEP`): at a long context one forward reads a long KV cache for all its rows, so extra verified rows cost
relatively less than at a short one, and the best length moves with it. The controller picks the (d, k) with the most
tokens per second, d = 0 (1 / vanilla step) included: where a target forward over d + 1 rows costs d + 1 one-row
forwards, no acceptance pays and it decodes plainly. Counts decay (older steps weigh less) so a request that changes
language or domain moves its choice; priors (FR-Spec's corpus coverage when the ranking has counts, `PRIOR_ACCEPTANCE`)
stand in before anything is observed. The prompt is evidence of coverage before the first step (`observe_prompt`): a
German prompt is answered in German, a code file continued in code, and the ranks of its last tokens say so where
the corpus's coverage (ShareGPT, mostly English) cannot.

When sampling, a step adds each reached position's probability of acceptance (and the target's probability inside
the rows drafted from) instead of its accept/reject outcome (decode/acceptance.py): the same counts in
expectation, without the coin flips' noise, which at temperature 1.0 made a few unlucky early rejections turn a
request to plain decoding for most of its steps (measured: 38 of 48 steps on a long-context prompt where every
static row gained 4-30%).

A draft costs little to try and its outcome is the only evidence of acceptance, so plain decoding needs more than the
point estimate: it is chosen only when drafting loses even at each position's upper confidence bound (`UPPER_BOUND_SDS`
standard deviations above the estimate, over the evidence it rests on). After one early rejection (one draft against
`PRIOR_DRAFTS` of prior) the bound is still high and drafting goes on; after many, the bound has closed in on a low
acceptance and plain decoding is chosen. Such a step drafts the (d, k) that loses least at the point estimate among
those the bound says pay, usually one draft: where the margin is thin (int4 at a 4k context: 4 rows cost 2.8 one-row
forwards), bound-driven chains of 2-3 that emitted 1-2 tokens each cost more than exploring wins (measured: eight such
steps at 0.27-0.42 s against 0.10 s plain steps). The standard deviation is that of what was observed (its second
moment, shrunk to the prior like the estimate): for accept/reject outcomes that is exactly the binomial alpha (1 -
alpha); sampled steps' expected counts spread less, so the bound closes in as much sooner as they are more informative
(measured before: at temperature 1.0 a 4k-token request went on drafting 20 times on binomial bounds above break-even
while every observed first-position acceptance was 0.08-0.57). Drafting where the point estimate says it pays is
unchanged. (Measured on the real pair: one rejection on a code prompt's first step made the point estimate prefer plain
decoding by 1%, and the request then decoded plainly for 43 of its 52 steps, where static drafts gained 20%.)

Plain decoding observes no agreement, so when it was chosen only because acceptance looked low (speculation could
pay at a higher one), a probe step drafts again every `probe_every` plain steps, at seeded jittered intervals: the
schedule, like every choice, is a function of the seed and the observations only. It drafts the length that loses
least at the estimate among those perfect acceptance would pay for: where rows cost in proportion that is one draft,
but where a forward over 2-7 rows costs about what one over 2 does (bf16 on the AVX-512 EPYC: 1.4-2.0x one row),
one draft pays that dear second row for the fewest tokens and shows the least.

A drafter does not run on plain steps, so its next draft first runs it over every token they emitted (`behind`); on
a machine where a forward over n rows costs about n one-row forwards (bf16 on a CPU without bf16 instructions) that
catch-up costs as much as the plain steps saved. Every drafting option's time includes it
(`StepCosts.catch_up_s`), so a probe is taken only where even perfect acceptance would win the catch-up back (by `PROBE_GAIN`:
a probe whose best case barely pays is not worth what it shows), and exploration stops sooner the further behind the
drafter is. For the same reason a request drafts at all only if
what drafting is expected to save over its tokens, at its estimates before the first step, wins back the drafter's
prefill over the prompt (`drafter_prefill_tokens`): once paid, that prefill is sunk, so it is weighed at the
estimate, not at the upper bound exploration uses. Where the whole prompt's prefill would not be won back, a draft
model may read only a window of it (its start and its last tokens, decode/draft_model.py): a cheaper prefill for a
drafter that sees less, taken where drafting wins that back. The estimate before the first step rests on one prior
acceptance for every request, so what drafting then saved, against what was expected, carries to the next requests
of the kind (sampling settings, the class of the prompt's length, and whether its tokens are common ones in the
ranking: translations and code files of one length are drafted differently) and scales their expectation, and how
its drafts were accepted becomes their prior acceptance (`carry_worth`; a kind with few drafts of its own leans on
those of every kind at its sampling setting). Where no draft pays at the prior, only a
request that drafts can show that its kind's drafts pay, so a kind's first request prefills its drafter where that
wins back at acceptance's upper bound (`FIND_OUT_MARGIN` times over) and costs little next to the request
(`EXPLORE_PREFILL_SHARE`). Where its
whole prompt's prefill costs more than that, it finds out through the longest prompt window whose prefill does
(translations of 612-748 tokens on the bf16 pair: 10-12% of a plain 128-token answer, where a 512-token window's is
7-8%). A drafter that read a window drafts differently (measured, the 0.5B drafter's agreement: translations 0.96
against 0.98 from the whole prompt, code 0.88-0.90 against 0.87, long-input QA 0.44-0.50 against 0.86-0.92), so
what windows' drafts show is carried apart and weighs only windows: a later request of the kind reads one where
they say it pays and its kind's prior alone does not. A request that prefilled to find out drafts at once (a probe
at its first plain step). A kind's requests differ all the same, so a later one still finds out its own where its
prefill costs under half its exploration budget (below), which the prefill then spends (`EXPLORE_PREFILL_OF_BUDGET`).
A drafter that can prefill late (a draft model reads tokens only: `Drafter.late_prefill`) first decodes a few tokens
plainly (`plain_tokens_first`), and its prefill then reads the prompt and those tokens, decided again over the tokens
left: a request whose answer ends within them never pays that prefill, and one that goes on forgoes what drafting
them would have saved, at most `LATE_PREFILL_SHARE` of the prefill. (Measured on the int4 pair at temperature 1.0,
docs/benchmarks.md: a sampled answer to a 1,005-token code prompt ended after 9 tokens, behind a 3.05 s drafter
prefill, and ran 2.26 tokens/s where vanilla's ran 9.4.)

The machine's costs are a table measured once (decode/step_costs.py); the engine rescales it from its own timed
forwards, after every request and within one (decode/cost_calibration.py). A row count timed fewer than
`CALIBRATION_SAMPLES` times is drafted, when its expected rate is within `COST_EXPLORE_LOSS` of the best, before
the best: a wrong table entry can only flip a decision that close, and the controller would otherwise never time
the length it wrongly avoids. Plain decoding is timed however far behind it looks (a few plain steps, which spend
no exploration budget): every draft is weighed against it, and while only drafts are timed, rescaling holds their
scale down to one row, so a table that read multi-row forwards too cheap keeps its drafts looking paying (replayed
over the AVX2-only EPYC's int4 drafts with 2 rows and more 1.3x dearer than the table: MT-Bench's first question
drafted 46 of 46 steps at 0.94x vanilla). The counts it goes by are those at the request's start plus its own
steps', so this too is a function of the seed, the observations and the starting table.

Each step taken only to find out (a probe, a draft on acceptance's upper bound alone, a timing draft) is bounded
alone; together they may lose at most `EXPLORE_BUDGET` of the request's expected plain decoding time, counted by the
clock where the engine times them, against plain steps at the costs, net of what they saved (one that pays gives its
saving back), and once they have, the request drafts only where the estimate says drafting pays. A request that
finds out on a machine where every draft loses a little then costs at most its drafter's prefill and that share.

A chain chosen this way may run longer than the best fixed length, and stops where the drafter's own confidence says
the next draft will not pay (`chain_rule`): after each drafted token the drafter reports the draft distribution's
probability of it, and how often tokens drafted at such a probability were accepted (`drawn_acceptance` in
decode/acceptance.py; learned in `CONFIDENCE_EDGES` bins, shrunk to the pooled rate) turns the chain so far into the
probability that all of it is accepted. The bins are the drafter's calibration against the target, not the
request's, so a generator carries them from one request to its next with the same sampling settings
(`carried_confidence`), still decaying per draft: a 64-token request draws some 40-80 picks over six bins, each bin
leaning on the pooled rate until it holds a few, so started from empty bins it spent much of itself learning what the
last request knew. Another draft then adds that probability times the next
position's estimated acceptance in tokens, for one more draft forward and target row (the costs); it is drafted
while that, plus what going on after it is expected to be worth (`LOOKAHEAD` picks ahead, each falling in a
confidence bin as often as the picks so far have; beyond them the best run at the positions' estimates), is at
least what the same time earns at the rate the step was chosen for, up to the longest allowed length. With
confidence telling nothing (every bin at the pooled rate) this stops where the best fixed length does, whatever the
cost curve; with it, sure stretches draft long and unsure picks end the chain (measured on MT-Bench at temperature
1.0 with the real pair: a draw the drafter gave under 5% was accepted 42% of the time, one above 90% 97%; replayed
over those chains at the table's costs, stopping this way beat the best fixed length by 5%, and by 2% weighing the
next draft alone). Only chains the controller chose as the best estimate stop early; probes, timing drafts and
bound-driven tries draft their length.

Losslessness does not depend on any of this: every (d, k) is a valid proposal, verified by the one verifier, and a
chain's length depends only on what the drafter drew, never on the target.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field, replace
from typing import Sequence

from frspec.decode.cost_calibration import CALIBRATION_SAMPLES
from frspec.decode.step_costs import StepCosts
from frspec.decode.tree_growth import KeepDrafting
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError

# Per-draft acceptance assumed before a request has shown any (the bench's measured 0.72 at 3 drafts of the 0.5B
# draft, bench/row_costs.py's ASSUMED_ACCEPTANCE), weighing as this many observed drafts.
PRIOR_ACCEPTANCE = 0.72
PRIOR_DRAFTS = 4.0
# A deeper chain position's agreement leans on the pooled agreement of all positions as on this many drafts of its
# own (the first position, drafted on every drafting step, as on PRIOR_DRAFTS). Measured with the int4 pair over the
# teacher-forced greedy drafts of 18 mix prompts (docs/auto.md, "How deep positions are estimated"): a draft at the
# second or third position, after the ones before it were accepted, agreed as often as one at the first, prompt by
# prompt, so one rejection at a deeper position says little of that position. Weighed against PRIOR_DRAFTS, one
# rejected unsure second pick held a Spanish prompt's second position at 0.69-0.79 for 14 steps while its drafts
# agreed 0.94 of the time, and chains stopped after one draft. Replayed over those drafts at the run's costs: 4 -> 16
# ran the mix 1.043x -> 1.047x the best static row, no dataset lower; a position that does agree less (an EAGLE
# head's deeper drafts) still pulls its estimate down as its drafts accumulate.
POSITION_DRAFTS = 16.0
# Coverage before any token is seen: the ranking corpus's (1.0 without counts), weighing as this many tokens.
PRIOR_TOKENS = 8.0
# Per observed token / drafted position, older evidence keeps this share of its weight: about the last 200 tokens
# and the last 60 steps' drafts matter.
TOKEN_DECAY = 1.0 - 1.0 / 200
DRAFT_DECAY = 1.0 - 1.0 / 60
# Each prompt token counts as this share of an emitted one (decayed like them, the last weighing most): a prompt of
# 600+ tokens weighs about 10 tokens next to PRIOR_TOKENS of the corpus's coverage, a 50-token one about 2 (short
# user questions hold rarer words than their answers). Measured with the ShareGPT ranking over the mix's prompts and
# their greedy outputs (docs/auto.md): German, the 32k map held 0.68 of the last 200 prompt tokens and 0.63 of the
# output (corpus: 0.98); code, 0.93-0.95 and 0.94-0.97; MT-Bench, 0.86-0.90 and 1.00.
PROMPT_TOKEN_WEIGHT = 0.05
# Prompt tokens further back than this weigh less than e^-5 of the last one: not counted.
PROMPT_WINDOW = 1000
PROBE_EVERY = 16
# ... and only where perfect acceptance would beat plain decoding by at least this share: finding out that acceptance
# is high is worth what drafting would then gain, and a probe whose best case barely pays costs more than what it can
# show is worth. On the int4 pair on the AVX2-only EPYC (4f58b3e), 22 plain steps behind, only a chain of 6 won its
# catch-up back at perfect acceptance, and that probe (7 target rows, 6 drafts, the catch-up) cost MT-Bench's first
# question 0.5 s. Replayed over the 9-prompt int4 mix's drafts at all 94 kept cost tables (docs/benchmarks.md,
# "Exploration that needs an upside"): that table's MT-Bench 0.957x -> 0.981x the best static row, no table's dataset
# lower (with FIND_OUT_MARGIN); at 10% an AVX512 temperature-1.0 table's code fell 1.032x -> 0.988x.
PROBE_GAIN = 0.05
# Plain decoding only when drafting loses even at acceptance this many standard deviations above its estimate.
UPPER_BOUND_SDS = 1.5
# ... and only while the estimate says that draft loses at most this share of plain decoding's rate: a draft that
# loses more is no cheap try (int4 at a 4k context: a chain of 3 costs 2.8 plain steps and emitted 1-2 tokens).
# Both chosen by replaying the controller offline over teacher-forced greedy drafts of real prompts (docs/benchmarks.md,
# int4 mix after the exploration constants): at 1.0 SD and 10%, a few early rejections on code prompts at 1k tokens
# turned requests plain for 20-50 of their 63 steps where drafting throughout ran 1.0-1.1x vanilla. At 1.5 SD, 10%
# instead of 20% changed nothing in the int4 mix's replays (greedy and temperature-1.0 costs: 1.061x and 1.082x the
# best static row), and where a kind's first request drafts to find out (EXPLORE_PREFILL_SHARE) on the bf16 costs,
# where every draft lost 0-14%, a 51-token question then drafted chains of 3 near break-even for 48 of 54 steps at
# 20% (0.87x vanilla) and 34 of 75 at 10% (0.92x) (docs/benchmarks.md, "A kind's first request finds out").
EXPLORE_LOSS = 0.10
# A draft length whose target forward was timed fewer than CALIBRATION_SAMPLES times is tried while its expected rate
# is within this share of the best (module docstring): the stale table that cost `auto` 4% at temperature 1.0
# (decode/cost_calibration.py) put a 2-token draft 3-8% behind the best length at per-draft acceptance 0.6-0.8.
COST_EXPLORE_LOSS = 0.10
# Chain lengths an automatic length chooses among (0: plain decoding); tune's CHAIN_LENGTHS go to 5.
AUTO_DEPTHS = (0, 1, 2, 3, 4, 5, 6)
# Map sizes an automatic size chooses among, besides the ranking's own length and the whole head.
AUTO_SIZES = (4096, 8192, 16384, 32768, 65536)
# The drafter's probability of its drafted token, binned at these edges, is what `chain_rule` learns acceptance by.
CONFIDENCE_EDGES = (0.1, 0.3, 0.5, 0.7, 0.9)
# Picks beyond the next one `chain_rule` looks ahead: a draft is worth what it adds plus the chance it opens to go on
# (a sure pick makes the draft after it pay), so weighing the next draft alone stops too soon. Replayed over chains of
# 5 at temperature 1.0 with the real pair (docs/auto.md): weighing the next draft alone ran 1.024x the best fixed
# length at the fresh table's costs, one pick ahead 1.052x; two and three picks ahead chose the same as one there.
# Two: with a flatter target curve and a dearer draft (fake costs, 0.3 + 0.005 n s and 0.07 s) a second pick ahead
# found a run of sure picks worth drafting that one did not, and a few dozen small sums cost nothing next to a draft.
LOOKAHEAD = 2
# The context a step's costs are read at is rounded to this many tokens (costs move little within it; the step
# times are then computed once per such stretch of a request, not every step).
CONTEXT_STEP = 32
# What drafting saved on a request, against what it was expected to save before its first step (at the prior), is
# carried to the next requests of its kind and scales that expectation (`CarriedWorth`): each later request of the
# kind keeps this share of an earlier one's weight, the prior (1: as expected) weighs as one request, one request's
# ratio counts up to WORTH_MAX, and a request weighs its emitted tokens over WORTH_TOKENS, up to 1.
WORTH_DECAY = 0.7
WORTH_MAX = 4.0
WORTH_TOKENS = 64
# A request's kind, for the carried worth: its sampling settings and the class of its prompt's length, split at these
# token counts. Measured (int4 pair, AVX512 EPYC, 256 tokens, docs/benchmarks.md): drafting saved 1.03x what the
# prior expected on MT-Bench's 51-61-token questions, 1.55-2.12x on code files of 1,005-1,309 tokens and 2.5-3.2x on
# translations of 612-638 tokens: requests whose answers draw on a long prompt are drafted better.
PROMPT_CLASSES = (128, 512, 2048)
# ... and whether its prompt's tokens are common ones: at least COMMON_SHARE of its last PROMPT_WINDOW tokens ranked
# under COMMON_RANKS in the drafter's ranking. Prompts in another language or script than the ranking corpus's are
# drafted differently from code and English chat of the same length: measured with the ShareGPT ranking over the
# mix's prompts (docs/auto.md), German, Spanish, Italian, Russian, Japanese and Chinese prompts of 612-807 tokens held
# 0.26-0.82 of their tokens in the first 32k ranks, code files of 932-1,309 tokens 0.87-0.95, MT-Bench questions
# 0.86-0.97; translations were accepted 3.4-3.9 tokens a chain of 3 where code was 2.9-3.1 (bf16 pair, greedy), and
# on a machine where only translations paid, the two shared one carried acceptance.
COMMON_RANKS = 32768
COMMON_SHARE = 0.85
# A kind's first requests, with too few drafts carried from earlier ones (under PRIOR_DRAFTS), are the only way to
# learn how its drafts are accepted: such a request prefills its drafter where drafting pays at acceptance's upper
# bound (not only at the estimate), provided that prefill costs at most this share of the request's expected plain
# decoding time. A kind whose prefill is dearer is weighed at the estimate alone. Measured (bf16 pair, AVX512 EPYC,
# 128 tokens): at PRIOR_ACCEPTANCE no draft was expected to save anything, so no request drafted and none showed what
# its kind accepted; translations, whose drafter prefill over 612 tokens cost 1.7 s (9% of a plain answer), ran
# plainly at 0.78x the drafter without a map, while code files' 1,309-token prefill (4.2 s, 22%) would have cost
# code 10-20% to try where every static row lost to vanilla.
EXPLORE_PREFILL_SHARE = 0.10
# ... and where the saving at acceptance's upper bound over its tokens is this many times that prefill: the bound is
# the best the kind may turn out to be, and a prefill it barely wins back is a sure cost for a slim chance. Replayed
# as PROBE_GAIN's: the AVX2-only EPYC's bf16 tables, where every draft loses, then no longer prefill code files of
# ~1,000 tokens to find out (code 0.972x -> 1.000x the best static row), no table's dataset lower.
FIND_OUT_MARGIN = 1.5
# The steps a request takes only to find out (probes, drafts on acceptance's upper bound alone, timing drafts) may
# together lose at most this share of the request's expected plain decoding time, net of what they saved (by the clock
# against plain steps at the costs, `count_saving`); once they have, it drafts only where the estimate says drafting
# pays. Each such step is bounded alone (EXPLORE_LOSS, COST_EXPLORE_LOSS, a probe's catch-up), their number was not.
# Measured (bf16 pair, AVX512 EPYC, 128 greedy tokens): a run's first MT-Bench question, where every draft lost 0-14% at
# the costs, prefilled its drafter to find out and then drafted 15 of its 115 steps (1.66 s of drafting, 0.91x vanilla,
# `5648e52`); in another run 5 probes and their catch-ups took 0.57 s of drafting. 3% of a 128-token answer's 17 s is
# 0.5 s.
EXPLORE_BUDGET = 0.03
# A later request of a kind, whose carried drafts are enough to go by, differs from them all the same: MT-Bench's
# questions (bf16 pair, AVX512 EPYC, 128 greedy tokens, static chains of 3 at 32k) ran 0.83-1.43x vanilla one by one,
# and after the first two lost, `auto` decoded the three that gained 1.22-1.43x plainly. Such a request still
# prefills to find out its own acceptance where that wins the prefill back at acceptance's upper bound and the prefill
# costs at most this share of its EXPLORE_BUDGET, which the prefill then spends (the steps that find out get the
# rest): a short prompt's prefill is cheap next to its answer (a 60-token question's 0.2 s of a 13 s answer).
EXPLORE_PREFILL_OF_BUDGET = 0.5
# The plain tokens a request decodes before a late drafter prefill (`plain_tokens_first`) forgo, at the saving a token
# is expected to make, at most this share of that prefill's time: deferring pays where more than this share of
# requests end within those tokens (a fixed cost against a per-token one, for a length not known in advance). At 5%,
# at a greedy int4 mix's estimates (AVX-512 EPYC): a 1,005-token code prompt (a 3.0 s prefill, 0.016 s expected a
# token) waits 9 tokens, a 612-token translation (1.95 s, 0.015 s) 6, a 51-token question (0.26 s, 0.005 s) 2.
LATE_PREFILL_SHARE = 0.05


# Per CONFIDENCE_EDGES bin: decayed acceptance of the drafts drawn at that draft probability, and decayed drafts.
ConfidenceBins = tuple[list[float], list[float]]


@dataclass(frozen=True)
class CarriedWorth:
    """What drafting saved on earlier requests of one kind against what was expected before their first steps
    (`carry_worth`): decayed sums of each request's ratio and weight; and how their drafts were accepted: decayed
    sums of their (decayed) agreed drafts, drafts and squared agreement, pooled over positions, which the next
    request's pooled agreement starts from instead of PRIOR_ACCEPTANCE (`new_request`)."""

    ratios: float = 0.0
    weight: float = 0.0
    agreed: float = 0.0
    tried: float = 0.0
    squared: float = 0.0

    @property
    def scale(self) -> float:
        """The ratio the next request's expected saving is scaled by: the requests', shrunk towards 1 (as expected),
        which weighs as one request."""
        return (self.ratios + 1.0) / (self.weight + 1.0)

    def acceptance(self, prior: tuple[float, float] = (PRIOR_ACCEPTANCE, PRIOR_ACCEPTANCE)) -> tuple[float, float]:
        """The pooled agreement (and its second moment) the kind's next request starts from: the carried drafts',
        shrunk towards `prior` as on PRIOR_DRAFTS drafts (by default PRIOR_ACCEPTANCE, coin flips at it: second
        moment = itself)."""
        total = self.tried + PRIOR_DRAFTS
        return ((self.agreed + PRIOR_DRAFTS * prior[0]) / total, (self.squared + PRIOR_DRAFTS * prior[1]) / total)


@dataclass(frozen=True)
class ControllerSettings:
    """What the controller may choose among. `depths`: draft lengths (0 = plain decoding) for chains; `shape`: a
    tree drafted as is instead of chains (or, with `allow_plain`, not at all); `sizes`: map sizes (ascending; the
    ranked head's full size = no map)."""

    sizes: tuple[int, ...]
    depths: tuple[int, ...] = AUTO_DEPTHS
    shape: TreeShape | None = None
    allow_plain: bool = True
    probe_every: int = PROBE_EVERY
    recalibrate: bool = True  # the engine rescales the costs from its timed forwards, after and within requests
    stop_early: bool = True  # chains end where the drafter's confidence says the next draft will not pay

    def __post_init__(self) -> None:
        if not self.sizes or any(isinstance(k, bool) or int(k) != k or k < 1 for k in self.sizes):
            raise FrspecError(f"map sizes must be positive integers, got {self.sizes}")
        if self.shape is None and (not self.depths or any(int(d) != d or d < 0 for d in self.depths)):
            raise FrspecError(f"draft lengths must be integers >= 0, got {self.depths}")
        object.__setattr__(self, "sizes", tuple(sorted({int(k) for k in self.sizes})))
        depths = ((0,) if self.allow_plain else ()) + (self.shape.depth,) if self.shape is not None else self.depths
        object.__setattr__(self, "depths", tuple(sorted({int(d) for d in depths})))

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def is_fixed(self) -> bool:
        """Nothing to choose: one size and one length."""
        return len(self.sizes) == 1 and len(self.depths) == 1


def default_map_sizes(full_size: int, ranked_size: int | None = None) -> tuple[int, ...]:
    """The sizes `auto` chooses among for a head of `full_size` rows whose first `ranked_size` are ranked:
    AUTO_SIZES up to the ranking's length (a tiny vocabulary: its eighth, quarter and half), the ranking's length
    and the whole head (no map). No size between the ranking's length and the whole head: the rows beyond the
    ranking follow by id, so such a size would be a map of arbitrary ids (a 32k map file as the ranking: 32k, then
    the whole head, no 64k)."""
    ranked = full_size if ranked_size is None else min(int(ranked_size), full_size)
    base = [s for s in AUTO_SIZES if s < ranked]
    if not base:
        base = [s for s in (full_size // 8, full_size // 4, full_size // 2) if 1 <= s < ranked] or [ranked]
    return tuple(sorted({*base, ranked, int(full_size)}))


@dataclass
class Plan:
    """One step's choice."""

    depth: int
    size: int
    probe: bool = False  # drafting only to observe acceptance again
    timing: bool = False  # chosen to time a row count the costs have too few forwards of (not the best estimate)
    bound: bool = False  # drafted because acceptance's upper bound says it pays, where the estimate says it does not
    # An adaptive chain (longest > 0) may run from `depth`, the best fixed length by the estimate, up to `longest`:
    # `chain_rule` ends it where another draft does not pay at `rate`, the expected tokens per second of `depth`.
    longest: int = 0
    rate: float = 0.0

    @property
    def adaptive(self) -> bool:
        return self.longest > 0

    @property
    def drafts(self) -> int:
        """The most tokens the step drafts."""
        return max(self.depth, self.longest)

    @property
    def finding_out(self) -> bool:
        """Drafted to find out (acceptance, or a row count's cost), not as the best estimate: EXPLORE_BUDGET."""
        return self.depth > 0 and (self.probe or self.timing or self.bound)


@dataclass
class ControllerState:
    """What one request has shown so far (decayed counts) and what was chosen."""

    settings: ControllerSettings
    coverage_prior: dict[int, float]
    hits: dict[int, float] = field(default_factory=dict)  # decayed emitted tokens inside the first k rows
    seen: float = 0.0  # decayed emitted tokens
    agreed: list[float] = field(default_factory=list)  # per position: decayed drafts that matched
    tried: list[float] = field(default_factory=list)  # per position: decayed drafts whose rows held the token
    squared: list[float] = field(default_factory=list)  # per position: decayed agreed^2 / tried, for the spread
    plain_steps: int = 0  # consecutive plain steps
    behind: int = 0  # tokens emitted by plain steps since the drafter last drafted: its next forward's extra rows
    next_probe: int = PROBE_EVERY
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    chosen_sizes: dict[int, int] = field(default_factory=dict)  # speculative steps per map size
    chosen_depths: list[int] = field(default_factory=list)  # steps per draft length
    step_times: dict = field(default_factory=dict)  # (depth, size, context) -> seconds under `step_times_of`
    step_times_of: StepCosts | None = None  # the costs `step_times` were computed from (another one starts over)
    # Timed target forwards per row count behind the costs (at the request's start, plus this request's steps);
    # None: the costs are not recalibrated, so no length is drafted to time it.
    timed_rows: dict[int, int] | None = None
    # Per CONFIDENCE_EDGES bin: decayed acceptance of drafts drawn at that draft probability, and decayed drafts.
    confident_accepted: list[float] = field(default_factory=lambda: [0.0] * (len(CONFIDENCE_EDGES) + 1))
    confident_drafts: list[float] = field(default_factory=lambda: [0.0] * (len(CONFIDENCE_EDGES) + 1))
    confidences: list[float] = field(default_factory=list)  # this step's drafted tokens' draft probabilities
    # The drafter-prefill decision's scale for the expected saving (earlier requests' CarriedWorth.scale); what was
    # expected per token before the first step, unscaled (None: not weighed); and, step by step, what the steps saved
    # at the costs against plain steps, over how many tokens (`count_saving`).
    worth: float = 1.0
    expected_saving: float | None = None
    prefill_saving: float = 0.0  # the saving a token the drafter's prefill was taken for (`plain_tokens_first`)
    # The pooled agreement (and its second moment) before this request's own drafts: PRIOR_ACCEPTANCE, or what its
    # kind's earlier requests carried (CarriedWorth.acceptance); and whether too few were carried to go by, so the
    # drafter's prefill may be weighed at acceptance's upper bound (EXPLORE_PREFILL_SHARE).
    prior_acceptance: float = PRIOR_ACCEPTANCE
    prior_second: float = PRIOR_ACCEPTANCE
    explore_prefill: bool = True
    # And whether too few drafts from prompt windows were carried (`window_worth`), so that, where the whole prompt's
    # prefill is too dear to find out with, a window's may be weighed at the upper bound instead.
    explore_window: bool = True
    # What those windows' drafts showed: the pooled agreement (and second moment) a window's drafts are weighed at,
    # shrunk towards this request's prior, and what drafting saved on them against that expectation (None, and the
    # kind's own worth: nothing carried from windows).
    window_acceptance: tuple[float, float] | None = None
    window_scale: float = 1.0
    saved_s: float = 0.0
    counted_tokens: int = 0
    # What the request's steps taken to find out may lose in all (EXPLORE_BUDGET of its expected plain time, set
    # where its drafter's prefill is decided; unbounded until then), and what they lost so far, net of what they
    # saved (`count_saving`).
    explore_budget_s: float = math.inf
    explored_s: float = 0.0
    # The drafter's prefill, where a later request of its kind took it only to find out (EXPLORE_PREFILL_OF_BUDGET):
    # spent from the same budget.
    explore_prefill_s: float = 0.0

    @property
    def may_explore(self) -> bool:
        """Whether the steps taken to find out have budget left (EXPLORE_BUDGET)."""
        return self.explored_s + self.explore_prefill_s < self.explore_budget_s

    def confident_acceptance(self, probability: float) -> float:
        """How often a draft drawn at this draft probability is accepted: its bin's rate, shrunk towards the
        pooled rate of all bins, itself towards PRIOR_ACCEPTANCE."""
        return self.bin_acceptance(bisect.bisect_right(CONFIDENCE_EDGES, probability))

    def bin_acceptance(self, b: int) -> float:
        """`confident_acceptance` of the drafts in bin b."""
        pooled = ((sum(self.confident_accepted) + PRIOR_DRAFTS * PRIOR_ACCEPTANCE)
                  / (sum(self.confident_drafts) + PRIOR_DRAFTS))
        return (self.confident_accepted[b] + PRIOR_DRAFTS * pooled) / (self.confident_drafts[b] + PRIOR_DRAFTS)

    def bin_shares(self) -> list[float]:
        """How often a draft falls in each confidence bin (decayed drafts, PRIOR_DRAFTS spread evenly over the
        bins): what the next pick's bin is expected to be."""
        bins = len(self.confident_drafts)
        total = sum(self.confident_drafts) + PRIOR_DRAFTS
        return [(n + PRIOR_DRAFTS / bins) / total for n in self.confident_drafts]

    def coverage(self, k: int) -> float:
        prior = self.coverage_prior.get(k, 1.0)
        return (self.hits.get(k, 0.0) + PRIOR_TOKENS * prior) / (self.seen + PRIOR_TOKENS)

    def agreement(self, position: int) -> float:
        """alpha_i, shrunk towards the pooled agreement of all positions, itself towards `prior_acceptance`."""
        pooled = (sum(self.agreed) + PRIOR_DRAFTS * self.prior_acceptance) / (sum(self.tried) + PRIOR_DRAFTS)
        if position >= len(self.tried):
            return pooled
        weight = _position_weight(position)
        return (self.agreed[position] + weight * pooled) / (self.tried[position] + weight)

    def agreement_spread(self, position: int) -> float:
        """The variance of one draft's agreement at this position: the observed second moment, shrunk towards the
        pooled one and that towards the prior's (`prior_second`: coin flips at PRIOR_ACCEPTANCE, or the kind's carried
        drafts'), minus alpha_i^2. Over accept/reject outcomes (x^2 = x) this is exactly the binomial
        alpha_i (1 - alpha_i); expected counts spread less."""
        alpha = self.agreement(position)
        pooled = (sum(self.squared) + PRIOR_DRAFTS * self.prior_second) / (sum(self.tried) + PRIOR_DRAFTS)
        second = pooled
        if position < len(self.tried):
            weight = _position_weight(position)
            second = (self.squared[position] + weight * pooled) / (self.tried[position] + weight)
        return max(second - alpha * alpha, 0.0)

    def agreement_upper_bound(self, position: int) -> float:
        """alpha_i plus UPPER_BOUND_SDS standard deviations of its estimate over the (decayed) drafts it rests on,
        prior included: wide after a few drafts, narrow after many."""
        alpha = self.agreement(position)
        tried = (self.tried[position] if position < len(self.tried) else sum(self.tried)) + PRIOR_DRAFTS
        return min(1.0, alpha + UPPER_BOUND_SDS * math.sqrt(self.agreement_spread(position) / tried))


def new_request(settings: ControllerSettings, coverage_prior: dict[int, float] | None = None,
                seed: int | None = None, timed_rows: dict[int, int] | None = None,
                confidence: ConfidenceBins | None = None, worth: CarriedWorth | None = None,
                setting_worth: CarriedWorth | None = None, window_worth: CarriedWorth | None = None
                ) -> ControllerState:
    """A fresh state for one request; `coverage_prior[k]` is the ranking corpus's coverage at k (default 1);
    `timed_rows`: the timed target forwards per row count the costs rest on (cost_calibration.StepTimings), with
    recalibration on; `confidence`: the confidence bins earlier requests left (`carried_confidence`), as decayed
    counts to go on from (None: empty bins); `worth`: what drafting saved on earlier requests of this kind against
    what was expected, and how their drafts were accepted (`carry_worth`; None: nothing carried, the expectation
    and PRIOR_ACCEPTANCE stand); `setting_worth`: the same carried over every kind of this sampling setting, whose
    acceptance the kind's own leans on (a kind with no drafts of its own starts from its setting's: at temperature
    1.0 a code file's first request starts from what MT-Bench's drafts showed at that temperature, not from a
    prior measured greedy); `window_worth`: the same carried from this kind's requests that drafted from a prompt
    window (`carry_worth`), apart from its whole prompts' (a window's drafts are accepted differently): its drafts,
    shrunk towards the request's prior, are what a window is weighed at where the kind's prior alone reads none
    (`drafter_prefill_tokens`), and its drafts' count whether a window is still read to find out."""
    rng = random.Random(0 if seed is None else seed)
    worth, window_worth = worth or CarriedWorth(), window_worth or CarriedWorth()
    setting = (setting_worth or CarriedWorth()).acceptance()
    prior, second = worth.acceptance(setting)
    carried = window_worth.weight > 0 or window_worth.tried > 0
    state = ControllerState(settings, dict(coverage_prior or {}), rng=rng,
                            timed_rows=None if timed_rows is None else dict(timed_rows), worth=worth.scale,
                            prior_acceptance=prior, prior_second=second, explore_prefill=worth.tried < PRIOR_DRAFTS,
                            explore_window=window_worth.tried < PRIOR_DRAFTS,
                            window_acceptance=window_worth.acceptance((prior, second)) if carried else None,
                            window_scale=window_worth.scale if window_worth.weight > 0 else worth.scale)
    if confidence is not None:
        accepted, drafts = confidence
        if len(accepted) != len(state.confident_accepted) or len(drafts) != len(state.confident_drafts):
            raise FrspecError(f"confidence bins carried over must be {len(CONFIDENCE_EDGES) + 1} per count")
        state.confident_accepted, state.confident_drafts = [float(a) for a in accepted], [float(n) for n in drafts]
    state.next_probe = _probe_interval(state)
    return state


def carried_confidence(state: ControllerState) -> ConfidenceBins:
    """The confidence bins a request leaves for the next one of its kind (module docstring): how often a draft drawn
    at each draft probability was accepted is the drafter's and the target's, not the request's, so a request need
    not learn it again from the prior. Copied: the state's own lists stay its own."""
    return list(state.confident_accepted), list(state.confident_drafts)


def observe_prompt(state: ControllerState, token_ranks: Sequence[int]) -> None:
    """Take the prompt's tokens (their ranks in the drafter's ranked head, in order) as evidence of coverage, each
    PROMPT_TOKEN_WEIGHT of an emitted token and decayed as emitted tokens are (module docstring). Call it once,
    before the request's first step."""
    ranks = list(token_ranks)[-PROMPT_WINDOW:]
    weights = [PROMPT_TOKEN_WEIGHT * TOKEN_DECAY ** (len(ranks) - 1 - i) for i in range(len(ranks))]
    carried = TOKEN_DECAY ** len(ranks)  # what any earlier evidence keeps after them
    state.seen = state.seen * carried + sum(weights)
    for k in state.settings.sizes:
        state.hits[k] = state.hits.get(k, 0.0) * carried + sum(w for w, r in zip(weights, ranks) if r < k)


def expected_tokens(state: ControllerState, depth: int, k: int, alphas: Sequence[float] | None = None,
                    coverage: float | None = None) -> float:
    """Tokens a step of `depth` drafts at map size k emits on average: 1 + sum_j prod_{i<j} alpha_i c(k).
    (`alphas`, `coverage`: the state's values, when the caller computed them already.)"""
    c = state.coverage(k) if coverage is None else coverage
    total, reach = 1.0, 1.0
    for i in range(depth):
        reach *= (state.agreement(i) if alphas is None else alphas[i]) * c
        total += reach
    return total


def step_shape(settings: ControllerSettings, depth: int) -> TreeShape | None:
    """What a step drafting `depth` drafts under `settings` (None: a plain step)."""
    if depth == 0:
        return None
    return settings.shape.with_depth(depth) if settings.shape is not None else TreeShape.chain(depth)


def target_rows(settings: ControllerSettings, depth: int) -> int:
    """Rows of the target's forward in a step drafting `depth` (0: a plain step's one row)."""
    shape = step_shape(settings, depth)
    return 1 if shape is None else shape.max_drafts + 1


def rates(state: ControllerState, costs: StepCosts, remaining: int | None = None,
          acceptance: str = "estimate", context: int | None = None) -> dict[tuple[int, int], float]:
    """Expected tokens per second of every allowed (depth, size) after `context` tokens (None: the costs' flat
    tables), at each position's estimated agreement (`acceptance="estimate"`), its upper confidence bound
    ("upper"), or assuming every draft whose rows hold the target's token agrees ("perfect": alpha = 1, the best
    speculation could do on this request's coverage). A drafter left behind by plain steps (`state.behind`) first
    catches up over their tokens: a drafting step costs that too (`StepCosts.catch_up_s`)."""
    agreement = {"estimate": state.agreement, "upper": state.agreement_upper_bound,
                 "perfect": lambda i: 1.0}[acceptance]
    s = state.settings
    out = {}
    depths = s.depths
    if remaining is not None:  # drafts beyond the token budget could not be emitted: shorten them (as the step does)
        depths = sorted({min(d, max(remaining - 1, 0)) for d in depths})
    alphas = [agreement(i) for i in range(s.max_depth)]
    coverage = {k: state.coverage(k) for k in s.sizes}
    catch_up = costs.behind_s(state.behind, context)
    for depth in depths:
        for k in (s.sizes if depth else s.sizes[-1:]):
            tokens = expected_tokens(state, depth, k, alphas, coverage[k])
            out[(depth, k)] = tokens / (_step_time(state, costs, depth, k, context) + (catch_up if depth else 0.0))
    return out


def speculation_can_pay(settings: ControllerSettings, costs: StepCosts,
                        contexts: Sequence[int | None] | None = None) -> bool:
    """Whether any allowed draft beats plain decoding even at best (every draft accepted, every map covering) at
    any of `contexts` (default: every context the costs were measured at): if not, this machine's costs rule
    speculation out for those contexts, and the engine does not even prefill the drafter."""
    if settings.max_depth == 0:
        return False
    if 0 not in settings.depths:
        return True  # plain decoding is not an option here (an explicit length or tree): draft anyway
    if contexts is None:
        contexts = costs.contexts or [None]
    for context in contexts:
        plain = costs.step_time_s(None, context=context)
        best = min(costs.step_time_s(step_shape(settings, d), k, context) / (d + 1)
                   for d in settings.depths if d for k in settings.sizes)
        if best < plain:
            return True
    return False


def drafter_prefill_tokens(state: ControllerState, costs: StepCosts, prompt_tokens: int, max_new_tokens: int,
                           windows: Sequence[int] = (), expected_tokens: float | None = None) -> int:
    """How many of the prompt's tokens the drafter's prefill reads: the whole prompt where drafting wins that prefill
    back, else the longest of `windows` (windows a drafter can read, shorter than the prompt: DraftModelDrafter's
    `prefill`) that is won back, else 0: the request decodes plainly and the drafter never runs.

    Won back: the seconds the best draft is expected to save per token (a token's expected time, plain against the
    best draft, at this fresh `state`'s estimates: the acceptance prior, the corpus's coverage and the prompt's
    evidence, averaged over the request's contexts; recorded as `state.expected_saving`) over the `expected_tokens`
    the request is expected to emit (decode/answer_lengths.py; default: all its `max_new_tokens`), scaled by what
    drafting saved on earlier requests of this kind against that expectation (`state.worth`, `carry_worth`), exceed
    the drafter's prefill over those tokens. The prior is one acceptance for every request, where a translation's
    drafts are accepted 0.95 of the time and a chat answer's 0.6-0.7: at the prior alone, a German prompt of 612
    tokens fell just short of its whole prefill, read a 256-token window instead, was drafted poorly from it and
    ran 0.80x the drafter without a map (int4 pair, 256 tokens), where code and translations before it had saved
    1.5-3x what the prior expected.
    Not at acceptance's upper bound, as exploration is: a wrong exploratory draft costs one step, a wrong prefill is
    sunk. (Measured on the AVX512 EPYC with the int4 pair, 64 tokens after a 1,005-token code prompt: drafting could
    save 4.3 s at best and 2.3 s at the prior, the drafter's prefill was estimated at 4.4 s and took 5.7 s, and the
    request, which prefilled on the bound, ran 0.86x vanilla end to end; German and Spanish prompts of ~620 tokens,
    0.89-0.90x.) A window is weighed at the same saving, drafted at the target's context: a drafter that read less
    of the prompt may be accepted less often, which the request's own observations then tell the controller, and
    its shorter cache makes its forwards a little cheaper than that. Where that reads no window, one is still read
    where what the kind's earlier windows' drafts showed (`new_request`'s `window_worth`) says it pays, and a kind's
    first requests whose whole prompt is too dear to find out with find out through one (`_finds_out`)."""
    if 0 not in state.settings.depths:
        return prompt_tokens  # plain decoding is not an option here (an explicit length or tree): draft anyway
    contexts = request_contexts(costs, prompt_tokens, max_new_tokens)  # flat costs: every context reads the same
    estimate = _estimated_saving(state, costs, max_new_tokens, contexts)
    if estimate is None:  # no draft length allowed, or a budget of one token: nothing to draft for
        return 0
    saved, plain_s = estimate
    state.expected_saving = saved
    emitted = max_new_tokens if expected_tokens is None else expected_tokens
    state.explore_budget_s = EXPLORE_BUDGET * emitted * plain_s
    # Decided again where the prefill is late, before any draft: only the last decision's prefill is spent.
    state.explore_prefill_s = 0.0
    state.prefill_saving = saved * state.worth
    prefill = costs.drafter_prefill_s(prompt_tokens)
    if state.prefill_saving * emitted > prefill:
        return prompt_tokens
    # Finding out: at acceptance's upper bound, where the prefill is cheap next to the request (`_finds_out`).
    bound = _estimated_saving(state, costs, max_new_tokens, contexts, acceptance="upper")[0]
    share = EXPLORE_PREFILL_SHARE if state.explore_prefill else EXPLORE_PREFILL_OF_BUDGET * EXPLORE_BUDGET
    if _finds_out(prefill, bound, share * emitted * plain_s, emitted):
        state.prefill_saving, state.next_probe = bound, 1
        if not state.explore_prefill:  # a later request finds out for itself, within its budget
            state.explore_prefill_s = prefill
        return prompt_tokens
    shorter = sorted((w for w in windows if w < prompt_tokens), reverse=True)
    for tokens in shorter:
        if state.prefill_saving * emitted > costs.drafter_prefill_s(tokens):
            return tokens
    if shorter and state.window_acceptance is not None:  # and at what the kind's windows' drafts showed
        windowed = replace(state, prior_acceptance=state.window_acceptance[0],
                           prior_second=state.window_acceptance[1])
        window_saved = _estimated_saving(windowed, costs, max_new_tokens, contexts)[0]
        for tokens in shorter:
            if window_saved * state.window_scale * emitted > costs.drafter_prefill_s(tokens):
                state.expected_saving, state.prefill_saving = window_saved, window_saved * state.window_scale
                return tokens
    if state.explore_prefill and state.explore_window:  # the kind's first requests: through a window
        for tokens in shorter:
            if _finds_out(costs.drafter_prefill_s(tokens), bound, EXPLORE_PREFILL_SHARE * emitted * plain_s,
                          emitted):
                state.prefill_saving, state.next_probe = bound, 1
                return tokens
    state.prefill_saving = 0.0
    return 0


def _estimated_saving(state: ControllerState, costs: StepCosts, max_new_tokens: int, contexts: Sequence[int],
                      acceptance: str = "estimate") -> tuple[float, float] | None:
    """The best draft's saving a token at `acceptance` (`rates`: the state's estimates, or their upper bound), and a
    plain step's time, averaged over `contexts` (None: no draft to weigh)."""
    saved, plain_s = 0.0, 0.0
    for context in contexts:
        options = rates(state, costs, max_new_tokens, acceptance=acceptance, context=context)
        plain = options[(0, state.settings.sizes[-1])]  # a plain step's rate does not depend on acceptance
        drafting = [rate for (depth, _), rate in options.items() if depth]
        if not drafting:
            return None
        saved += max(1.0 / plain - 1.0 / max(drafting), 0.0) / len(contexts)
        plain_s += 1.0 / plain / len(contexts)
    return saved, plain_s


def _finds_out(prefill: float, bound: float, allowed: float, emitted: float) -> bool:
    """Whether a request prefills its drafter (`prefill` seconds) to find out how its drafts are accepted: where
    the saving a token at acceptance's upper bound (`bound`) over its `emitted` tokens wins the prefill back
    FIND_OUT_MARGIN times over and the
    prefill costs at most `allowed` seconds: EXPLORE_PREFILL_SHARE of the request's expected plain decoding time
    where its kind carried too few drafts to go by (what it finds out is the kind's), else EXPLORE_PREFILL_OF_BUDGET
    of its exploration budget (what it finds out is its own). A kind's first requests whose whole prompt is too
    dear for that read a window of it instead, where one's prefill fits EXPLORE_PREFILL_SHARE: what its drafts show
    is carried apart (`new_request`'s `window_worth`)."""
    return prefill <= allowed and bound * emitted > FIND_OUT_MARGIN * prefill


def plain_tokens_first(state: ControllerState, costs: StepCosts, prefill_tokens: int) -> int:
    """How many tokens (the target prefill's first one included) a request whose drafter can prefill late emits
    before the drafter's prefill over `prefill_tokens` of its prompt (module docstring): as many as forgo, at the
    saving per token the prefill was taken for (`drafter_prefill_tokens`: the estimate scaled by the carried worth,
    or acceptance's upper bound where it is taken to find out), LATE_PREFILL_SHARE of that prefill's time. Since a
    request prefills only where that saving over all its tokens wins the prefill back, that is under
    LATE_PREFILL_SHARE of its tokens. (At the estimate alone, a prefill taken to find out, expected to save almost
    nothing, waited past the end of the answer.)"""
    per_token = state.prefill_saving
    if not prefill_tokens or per_token <= 0.0:
        return 0
    return int(LATE_PREFILL_SHARE * costs.drafter_prefill_s(prefill_tokens) / per_token)


def count_saving(state: ControllerState, costs: StepCosts, drafted: int, size: int, emitted: int,
                 context: int | None = None, behind: int = 0, finding_out: bool = False,
                 clock_s: float | None = None) -> None:
    """Add what one step saved against plain steps, at the costs the controller chose by (not the clock's: a
    request's few seconds of noise would swamp the worth carried to its kind): `emitted` plain steps' time less the
    step's, a draft of `drafted` tokens over `size` rows (0: a plain step, which saves nothing) at `context`, after
    catching the drafter up over `behind` tokens. A step taken to find out (`Plan.finding_out`) spends what it lost
    from the request's EXPLORE_BUDGET (and gives back what it saved), by the clock where the step was timed
    (`clock_s`, its target forward and drafting) against plain steps at `costs`: near break-even each such draft
    loses a few milliseconds at the table and more by the clock, and a budget counted at the table was not spent
    while the request lost 5-9% (int4 pair, AVX2-only EPYC, `29f4565`). Summed over a request's steps, the clock's
    noise averages out where one step's would not."""
    context = _rounded(context)
    if drafted:
        spent = _step_time(state, costs, drafted, size, context) + costs.behind_s(behind, context)
        plain = emitted * _step_time(state, costs, 0, state.settings.sizes[-1], context)
        state.saved_s += plain - spent
        if finding_out:
            state.explored_s -= plain - (spent if clock_s is None else clock_s)
    state.counted_tokens += emitted


def carry_worth(previous: CarriedWorth | None, state: ControllerState, counts: bool) -> CarriedWorth:
    """The worth the next request of this one's kind starts from: `previous` aged by a request, plus, where this
    request's drafts `counts` (they were drafted from the prompt the worth is kept for: a kind's whole prompts, or
    its windows, `new_request`'s `window_worth`), its ratio of the saving per token its steps made (`count_saving`)
    to the one expected before its first step, and its drafts' pooled agreement counts (`CarriedWorth.acceptance`).
    A window's drafts are accepted differently from the whole prompt's (measured 0.44-0.50 against 0.86-0.92 on
    long-input QA), so the two are carried apart. A request whose drafts do not count only ages them, so after a
    stretch of plain requests the expectation is back to the prior's and a later request tries drafting again: a
    worth that fell too low to prefill any request could otherwise never be corrected (and with too few drafts
    carried, a kind's request explores again: EXPLORE_PREFILL_SHARE)."""
    previous = previous or CarriedWorth()
    ratios, weight = previous.ratios * WORTH_DECAY, previous.weight * WORTH_DECAY
    agreed, tried, squared = (x * WORTH_DECAY for x in (previous.agreed, previous.tried, previous.squared))
    expected = state.expected_saving
    if counts and expected is not None and expected > 0 and state.counted_tokens:
        ratio = min(max(state.saved_s / state.counted_tokens / expected, 0.0), WORTH_MAX)
        share = min(state.counted_tokens / WORTH_TOKENS, 1.0)
        ratios, weight = ratios + share * ratio, weight + share
    if counts:
        agreed, tried, squared = agreed + sum(state.agreed), tried + sum(state.tried), squared + sum(state.squared)
    return CarriedWorth(ratios, weight, agreed, tried, squared)


def prompt_is_common(token_ranks: Sequence[int] | None) -> bool | None:
    """Whether a prompt's tokens are common ones (COMMON_SHARE of its last PROMPT_WINDOW tokens ranked under
    COMMON_RANKS; `token_ranks`: their ranks in the drafter's ranking, in order); None: no ranking to tell."""
    if token_ranks is None:
        return None
    ranks = list(token_ranks)[-PROMPT_WINDOW:]
    return not ranks or sum(r < COMMON_RANKS for r in ranks) >= COMMON_SHARE * len(ranks)


def request_kind(prompt_tokens: int, token_ranks: Sequence[int] | None = None) -> tuple[int, bool | None]:
    """The class of a prompt's length (PROMPT_CLASSES) and whether its tokens are common ones (`prompt_is_common`
    of their ranks; None: no ranking) that a request's worth and acceptance are carried under."""
    return bisect.bisect_right(PROMPT_CLASSES, prompt_tokens), prompt_is_common(token_ranks)


def request_contexts(costs: StepCosts, prompt_tokens: int, max_new_tokens: int) -> list[int]:
    """The contexts one request's steps run at, as far as the costs tell them apart: its first and last, and every
    measured context in between (the costs are linear in the context between those)."""
    first, last = prompt_tokens, prompt_tokens + max(max_new_tokens - 1, 0)
    return sorted({first, last, *(c for c in costs.contexts if first < c < last)})


def choose(state: ControllerState, costs: StepCosts, remaining: int | None = None,
           context: int | None = None) -> Plan:
    """This step's draft length and map size (module docstring); ties go to the shorter draft, then the smaller
    map. `remaining`: tokens the request may still emit (longer drafts could not be used); `context`: tokens the
    target has before this step (prompt and generated; None: the costs' flat tables)."""
    s = state.settings
    context = _rounded(context)
    options = rates(state, costs, remaining, context=context)
    if not options:
        return _record(state, Plan(0, s.sizes[-1]))
    depth, k = _best(options)
    exploring = state.may_explore  # else only the best estimate is drafted (EXPLORE_BUDGET)
    untimed = _untimed(state, options, depth, drafts=exploring)
    if untimed:
        depth, k = _best(untimed)
        return _record(state, Plan(depth, k, timing=True))
    if depth > 0 and s.stop_early and s.shape is None:
        # The longest allowed chain, cut by `chain_rule` where the drafter's confidence says so.
        longest = max(d for d, _ in options)
        return _record(state, Plan(depth, k, longest=longest, rate=options[(depth, k)]))
    if depth > 0 or s.max_depth == 0 or (remaining is not None and remaining <= 1) or not exploring:
        return _record(state, Plan(depth, k))
    # Plain decoding wins on the estimate: draft anyway while acceptance's upper bound says drafting pays, but
    # explore with the draft that, among those the bound says pay, loses least at the estimate (usually the
    # shortest): a wrong guess then costs one cheap draft, not a long chain's extra rows.
    bounded = rates(state, costs, remaining, acceptance="upper", context=context)
    plain = bounded[(0, s.sizes[-1])]
    paying = {dk: options[dk] for dk, rate in bounded.items()
              if dk[0] > 0 and rate > plain and options[dk] >= (1.0 - EXPLORE_LOSS) * plain}
    if paying:
        depth, k = _best(paying)
        state.plain_steps = 0
        return _record(state, Plan(depth, k, bound=True))
    # Plain decoding: probe now and then if only the acceptance estimate, not the machine, rules speculation out.
    state.plain_steps += 1
    if state.plain_steps >= state.next_probe:
        hopeful = rates(state, costs, remaining, acceptance="perfect", context=context)
        best, plain = _best(hopeful), hopeful[(0, s.sizes[-1])]
        if best[0] > 0 and hopeful[best] > (1.0 + PROBE_GAIN) * plain:
            state.plain_steps = 0
            state.next_probe = _probe_interval(state)
            # The length that loses least at the estimate among those perfect acceptance would pay (where a
            # forward over 2-7 rows costs about what one over 2 does, a chain of 3 shows more for little more);
            # `best` is among them, since ties go to plain decoding.
            paying = {dk: options[dk] for dk, rate in hopeful.items()
                      if dk[0] > 0 and dk[1] == best[1] and rate > plain}
            return _record(state, Plan(_best(paying)[0], best[1], probe=True))
    return _record(state, Plan(0, k))


def chain_rule(state: ControllerState, costs: StepCosts, plan: Plan, context: int | None = None) -> KeepDrafting:
    """What a chain drafted for `plan` is asked after each token (tree_growth.KeepDrafting; module docstring):
    it records the token's draft probability for `observe`, and for an adaptive plan answers whether one more
    draft pays: its expected tokens (the probability that the chain so far is all accepted, by the confidence
    bins, times the next position's estimated acceptance) against the extra step time (one more draft and target
    row, at `context`) at the plan's rate, plus what going on after it is expected to be worth, LOOKAHEAD picks
    ahead (a draft that does not pay alone may open a stretch of sure ones)."""
    state.confidences = []
    if not plan.adaptive:
        def record(probability: float) -> bool:
            state.confidences.append(probability)
            return True
        return record
    context = _rounded(context)
    coverage = state.coverage(plan.size)
    # Per position after `drafted` tokens: the next draft's estimated acceptance and what drafting it costs at the
    # plan's rate; the confidence bins' shares and rates, for the picks ahead.
    accepts = [state.agreement(drafted) * coverage for drafted in range(plan.longest)]
    charges = [plan.rate * (_step_time(state, costs, drafted + 1, plan.size, context)
                            - _step_time(state, costs, drafted, plan.size, context))
               for drafted in range(plan.longest)]
    shares = state.bin_shares()
    bin_rates = [state.bin_acceptance(b) for b in range(len(shares))]
    mean_rate = sum(s * r for s, r in zip(shares, bin_rates))

    def worth(reach: float, drafted: int, ahead: int) -> float:
        """Expected tokens less their time's worth at the plan's rate of drafting on after `drafted` tokens whose
        chain is all accepted with probability `reach`, stopping after any pick where going on does not pay: the
        next pick's bin is drawn by the shares and its rate, scaled so that their mean is the position's estimate
        (not capped at 1: the value stays linear in the reach, so looking further ahead can only find more),
        carries the reach on; `ahead` picks on, the best run at the positions' estimates stands in."""
        if ahead == 0 or drafted + 1 >= plan.longest:
            return best_run(reach, drafted)
        scale = accepts[drafted] / mean_rate
        return (reach * accepts[drafted] - charges[drafted]
                + sum(share * max(0.0, worth(reach * rate * scale, drafted + 1, ahead - 1))
                      for share, rate in zip(shares, bin_rates)))

    def best_run(reach: float, drafted: int) -> float:
        """The most a run of one or more further drafts after `drafted` is expected to be worth, at each position's
        estimate (without this, a dear next row would end a chain that two cheap rows after it make pay)."""
        total, best = 0.0, -math.inf
        for position in range(drafted, plan.longest):
            total += reach * accepts[position] - charges[position]
            reach *= accepts[position]
            best = max(best, total)
        return best

    reach = 1.0

    def keep_drafting(probability: float) -> bool:
        nonlocal reach
        state.confidences.append(probability)
        drafted = len(state.confidences)
        if drafted >= plan.longest:
            return False
        reach *= state.confident_acceptance(probability)
        return worth(reach, drafted, LOOKAHEAD) >= 0.0

    return keep_drafting


def observe(state: ControllerState, plan: Plan, accepted: int, token_ranks: Sequence[int] | None,
            expected: Sequence[tuple[float, float]] | None = None, drawn: Sequence[float] | None = None) -> None:
    """Take one step's outcome: `accepted` drafts were accepted, then the target chose one more token; `token_ranks`
    are the ranks (vocab/ranked_vocab.py) of the step's emitted tokens, accepted drafts first (None: the drafter's
    vocabulary is not ranked; every token then counts as inside its rows). `expected`: when sampling, each reached
    position's (acceptance probability, target mass inside the rows) from decode/acceptance.py, counted instead of
    the accept/reject outcomes (the same counts in expectation, with less noise). `drawn`: each reached
    position's probability of acceptance given its drawn token (acceptance.drawn_acceptance), counted in the bin
    of that token's draft probability as `chain_rule` recorded it."""
    s = state.settings
    for probability, acceptance in zip(state.confidences, drawn or ()):
        b = bisect.bisect_right(CONFIDENCE_EDGES, probability)
        state.confident_accepted = [a * DRAFT_DECAY for a in state.confident_accepted]
        state.confident_drafts = [n * DRAFT_DECAY for n in state.confident_drafts]
        state.confident_accepted[b] += acceptance
        state.confident_drafts[b] += 1.0
    state.confidences = []
    if state.timed_rows is not None:  # the engine times this step's forward for the costs (cost_calibration.py)
        rows = target_rows(s, plan.depth)
        state.timed_rows[rows] = state.timed_rows.get(rows, 0) + 1
    ranks = list(token_ranks) if token_ranks is not None else None
    if ranks is not None:
        for r in ranks:
            state.seen = state.seen * TOKEN_DECAY + 1.0
            for k in s.sizes:
                state.hits[k] = state.hits.get(k, 0.0) * TOKEN_DECAY + float(r < k)
    if plan.depth == 0:
        state.behind += 1  # the plain step's token: the drafter has not seen it
        return
    state.behind = 0
    if plan.depth > len(state.tried):
        grow = plan.depth - len(state.tried)
        state.tried.extend([0.0] * grow)
        state.agreed.extend([0.0] * grow)
        state.squared.extend([0.0] * grow)
    counts = _outcomes(plan, accepted, ranks) if expected is None else list(expected[:plan.depth])
    # Every position's evidence ages with each drafting step, reached or not. Aged only when reached, a position the
    # chain stops short of keeps its old evidence at full weight, and that evidence is what stops the chain there:
    # measured on a Spanish prompt (int4 pair, 256 tokens), one rejection at the second position in the third step
    # held its estimate at 0.80 for the next 130 steps while the first position's rose to 0.997, and `auto`
    # drafted one token a step where chains of 3 were all accepted (0.91-0.97x the drafter without a map; aged at
    # every position, chains of 3 on 64 of 65 steps, 1.00x: docs/benchmarks.md).
    for i in range(len(state.tried)):
        agreed, tried = counts[i] if i < len(counts) else (0.0, 0.0)
        state.agreed[i] = state.agreed[i] * DRAFT_DECAY + agreed
        state.tried[i] = state.tried[i] * DRAFT_DECAY + tried
        # One draft's agreement is agreed / tried, weighing `tried`: its square, weighed alike.
        state.squared[i] = state.squared[i] * DRAFT_DECAY + (agreed * agreed / tried if tried > 0 else 0.0)


def _outcomes(plan: Plan, accepted: int, ranks: list[int] | None) -> list[tuple[float, float]]:
    """(agreed, tried) of each drafted position the step reached, from its accept/reject outcome."""
    counts = [(1.0, 1.0)] * min(accepted, plan.depth)
    if accepted < plan.depth:
        # Rejected here: the draft's fault only if its rows held the target's token.
        held = ranks is None or (accepted < len(ranks) and ranks[accepted] < plan.size)
        counts.append((0.0, float(held)))
    return counts


def _untimed(state: ControllerState, options: dict[tuple[int, int], float], best_depth: int, drafts: bool = True
             ) -> dict[tuple[int, int], float]:
    """The options of another length than the best whose row count the costs have too few timed forwards of, and
    which decode plainly (at any rate: they spend no exploration budget) or, where `drafts`, draft at an expected
    rate within COST_EXPLORE_LOSS of the best (module docstring)."""
    if state.timed_rows is None:
        return {}
    best = max(options.values())
    return {(d, k): rate for (d, k), rate in options.items()
            if d != best_depth and (d == 0 or (drafts and rate >= (1.0 - COST_EXPLORE_LOSS) * best))
            and state.timed_rows.get(target_rows(state.settings, d), 0) < CALIBRATION_SAMPLES}


def _rounded(context: int | None) -> int | None:
    """The context costs are read at: to CONTEXT_STEP tokens."""
    return None if context is None else max(CONTEXT_STEP, round(context / CONTEXT_STEP) * CONTEXT_STEP)


def _best(options: dict[tuple[int, int], float]) -> tuple[int, int]:
    """The (depth, size) with the most tokens per second; ties go to the shorter draft, then the smaller map."""
    return max(options, key=lambda dk: (options[dk], -dk[0], -dk[1]))


def _step_time(state: ControllerState, costs: StepCosts, depth: int, k: int, context: int | None) -> float:
    """costs.step_time_s for (depth, k) at `context`, computed once per request and context (the costs do not
    change within one; given other costs, the memo starts over: an id() key could be reused by a new table)."""
    if state.step_times_of is not costs:
        state.step_times, state.step_times_of = {}, costs
    key = (depth, k, context if costs.contexts else None)
    if key not in state.step_times:
        state.step_times[key] = costs.step_time_s(step_shape(state.settings, depth), k, context)
    return state.step_times[key]


def _record(state: ControllerState, plan: Plan) -> Plan:
    if plan.depth >= len(state.chosen_depths):
        state.chosen_depths.extend([0] * (plan.depth + 1 - len(state.chosen_depths)))
    state.chosen_depths[plan.depth] += 1
    if plan.depth:
        state.chosen_sizes[plan.size] = state.chosen_sizes.get(plan.size, 0) + 1
    return plan


def _position_weight(position: int) -> float:
    """How many drafts of its own the pooled agreement weighs as in a position's estimate: the first position's as
    PRIOR_DRAFTS, a deeper one's as POSITION_DRAFTS (read here at each call, so a replay can set it)."""
    return PRIOR_DRAFTS if position == 0 else POSITION_DRAFTS


def _probe_interval(state: ControllerState) -> int:
    every = state.settings.probe_every
    return every + state.rng.randrange(0, max(every // 2, 1))
