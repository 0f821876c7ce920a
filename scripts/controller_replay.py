"""Replay the controller (decode/controller.py) offline over a draft model's teacher-forced greedy drafts of real
prompts, at a bench run's cost table: a controller change is weighed in seconds over many prompts, where a timed mix
takes 15-25 minutes over six. It chooses constants; a timed bench confirms them.

    python scripts/controller_replay.py drafts DRAFTS.pt --mix mtbench,code,multilingual --num-prompts 18 \\
        --max-new-tokens 256 --quant int4 [--answers RUN/results.json ...]
    python scripts/controller_replay.py replay DRAFTS.pt --costs RUN/results.json [--max-new-tokens 64] \\
        [--set NAME=VALUE ...] [--steps]

`drafts` runs the draft model once over each prompt and the target's greedy answer (a bench run's vanilla row from
`--answers` where it has the prompt, else generated here) and keeps, at every answer position and for every map size
`auto` chooses among, the drafter's greedy pick and its probability (the one `chain_rule` is shown), with the answer's
ranks in the ranked head. While a greedy chain is accepted, its picks are exactly these (each drafted after the
target's own tokens), so a chain's outcome is known for any length and size. Its map is the bench's: the ShareGPT
ranking of 65,536 ids.

`replay` plays the engine's loop (engine.py `_controlled_step`) for each prompt in order, carrying confidence bins,
worth and answer lengths from request to request as a generator does: drafter-prefill decision (a late one too; each
weighed over the answer length the kind's earlier answers give, `--max-new-tokens` the cap), choose, chain_rule
over the picks' probabilities, observe, count_saving, and the engine's timing of each step, which rescales the costs
the controller decides by (decode/cost_calibration.py, within and after requests; timing drafts included). Every
step takes the time of the run's cost table (`controller_costs`, as measured), or with `--truth-rows-scale X` of that
table with the target's forwards over 2 rows and more X times dearer: a table off where drafting's choices turn, as
the AVX2-only EPYC's tables were by x1.07-x1.29 (the controller starts from the table as measured and finds out as
the engine would). It prints per prompt auto's time against vanilla's and the static chains of 3 (map 32k, 64k,
none; timed at the same truth), then per dataset auto against the best of those rows. `--set
controller.NAME=VALUE` sets a module constant first (e.g. `--set POSITION_DRAFTS=4.0`).

Left out, so read ratios as the controller's choices at those costs, not a timed run: a prompt window's
drafts (replayed as the whole prompt's, flagged W), a chain's picks after its first rejection (replayed at the
teacher-forced probabilities; they only decide whether the chain goes on), and the clock's noise. Checked against a
timed run (int4 pair, AVX-512 EPYC, 64 tokens, `5c40db5`): mtbench-91 replayed at 0.949x vanilla, timed 0.94x.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from frspec.decode import controller
from frspec.decode import cost_calibration as calibration
from frspec.decode.answer_lengths import add_answer, expected_tokens
from frspec.decode.cost_calibration import StepTimings, recalibrated
from frspec.decode.step_costs import StepCosts

STATIC_SIZES = (32768, 65536)  # the bench's static map rows; the whole head is added
STATIC_DEPTH = 3
RANKING_SIZE = 65536
WINDOWS = (256, 512)  # DraftModelDrafter's prompt windows


def drafts(args) -> None:
    from frspec.bench.datasets import encode_prompt, load_prompts
    from frspec.bench.token_maps import resolve_token_maps
    from frspec.decode.factory import build_drafter, build_generator
    from frspec.models.loading import load_model, resolve_model_dir, set_threads, vocab_size_of
    from frspec.models.tokenizer import load_tokenizer

    set_threads(args.threads)
    tokenizer = load_tokenizer(resolve_model_dir(args.target))
    target = load_model(args.target, quant=args.quant)
    draft = load_model(args.draft, quant=args.quant, quantize_head=False)
    maps, _ = resolve_token_maps(tokenizer, vocab_size_of(target), [RANKING_SIZE], progress=False)
    drafter = build_drafter(target, draft=draft, token_map=maps[RANKING_SIZE], tokenizer=tokenizer,
                            token_map_size="auto", head_quant=args.quant)
    vocab = drafter.vocab
    sizes = controller.default_map_sizes(vocab.full_size, vocab.ranked_size)
    answers = {}
    for path in args.answers:
        for g in json.load(open(path))["generations"]:
            if g["method"].split()[-1] == "vanilla" and not g["method"].startswith("llama"):
                answers.setdefault(g["prompt_id"], g["token_ids"])
    vanilla = build_generator(target, tokenizer=tokenizer)
    records = []
    with torch.inference_mode():
        for prompt in load_prompts("mix:" + args.mix, num_prompts=args.num_prompts):
            ids = encode_prompt(tokenizer, prompt)
            answer = answers.get(prompt.id)
            if answer is None:
                answer = list(vanilla.generate(input_ids=ids, max_new_tokens=args.max_new_tokens).token_ids)
            answer = answer[: args.max_new_tokens]
            hidden = drafter.base(input_ids=torch.tensor([ids + answer])).last_hidden_state[0]
            hidden = hidden[len(ids) - 1 : len(ids) - 1 + len(answer)]  # row t predicts answer[t]
            record = {"id": prompt.id, "prompt_tokens": len(ids), "answer": answer,
                      "prompt_ranks": vocab.ranks(ids[-controller.PROMPT_WINDOW:]).tolist(),
                      "ranks": vocab.ranks(answer).tolist(), "picks": {}, "probs": {}}
            for k in sizes:
                probability, row = torch.softmax(vocab.logits(hidden, k).float(), -1).max(-1)
                record["picks"][k] = vocab.to_target(row).tolist()
                record["probs"][k] = probability.tolist()
            agreed = sum(a == b for a, b in zip(record["picks"][sizes[-1]], answer)) / max(len(answer), 1)
            print(f"{prompt.id}: {len(ids)} prompt tokens, {len(answer)} answer tokens, "
                  f"agreement without a map {agreed:.3f}", flush=True)
            records.append(record)
    coverage = {k: vocab.coverage(k) for k in sizes} if vocab.coverage_prior is not None else {}
    torch.save({"sizes": sizes, "coverage": coverage, "records": records, "mix": args.mix,
                "max_new_tokens": args.max_new_tokens}, args.out)


class Replay:
    """One generator's requests replayed at `costs`."""

    def __init__(self, costs: StepCosts, sizes, coverage, truth: StepCosts | None = None):
        # The controller decides at `costs`, rescaled as the engine rescales them from the forwards it times
        # (decode/cost_calibration.py), here timed at `truth` (default: the table itself, which rescaling keeps).
        self.table, self.costs, self.sizes, self.coverage = costs, costs, tuple(sizes), coverage
        self.truth = costs if truth is None else truth
        self.timings = StepTimings(costs)
        self.settings = controller.ControllerSettings(sizes=self.sizes)
        self.confidence, self.worth, self.lengths = None, {}, {}

    def time(self, timed: StepTimings, depth: int, k: int, context: int, behind: int) -> None:
        """Time a step as the engine does: its target forward, and its drafting where it drafted."""
        rows = controller.target_rows(self.settings, depth)
        timed.add_target(rows, context, self.truth.target(rows, context))
        if depth:
            shape = controller.step_shape(self.settings, depth)
            timed.add_draft(shape, k, context, behind, self.truth.draft_time_s(shape, k, context)
                            + self.truth.behind_s(behind, context))

    def step_s(self, depth: int, k: int, context: int, behind: int = 0) -> float:
        context = controller._rounded(context)
        if not depth:
            return self.truth.step_time_s(None, context=context)
        return (self.truth.step_time_s(controller.step_shape(self.settings, depth), k, context)
                + self.truth.behind_s(behind, context))

    def prefill_s(self, tokens: int) -> float:
        return self.truth.drafter_prefill_s(tokens) if tokens else 0.0

    def static(self, record: dict, new: int, k: int | None) -> float:
        """A chain of STATIC_DEPTH at map size k (None: plain decoding) over the answer's first `new` tokens."""
        answer, prompt = record["answer"][:new], record["prompt_tokens"]
        seconds, i = 0.0 if k is None else self.prefill_s(prompt), 1  # the target's prefill emits answer[0]
        while i < len(answer):
            depth = 0 if k is None else min(STATIC_DEPTH, len(answer) - i - 1)
            accepted = _accepted(record, k, i, depth)
            seconds += self.step_s(depth, k, prompt + i)
            i += accepted + 1
        return seconds

    def auto(self, record: dict, new: int, steps: bool = False) -> tuple[float, int, list[int]]:
        """auto's seconds over the answer's first `new` tokens, the drafter's prompt tokens, and its steps per
        drafted length."""
        answer, prompt = record["answer"][:new], record["prompt_tokens"]
        kind = controller.request_kind(prompt, record["prompt_ranks"])
        state = controller.new_request(self.settings, self.coverage, 0, self.timings.samples(), self.confidence,
                                       worth=self.worth.get(kind), setting_worth=self.worth.get("setting"),
                                       window_worth=self.worth.get((kind, "window")))
        controller.observe_prompt(state, record["prompt_ranks"])
        # Weighed, as the engine does, over the answer length its kind's earlier answers give (not this answer's).
        lengths = self.lengths.get(kind)
        drafter_prompt = controller.drafter_prefill_tokens(state, self.costs, prompt, new, WINDOWS,
                                                           expected_tokens=expected_tokens(lengths, 0, new))
        # A draft model prefills late, after this many tokens (the engine's _late_prefill), decided again then.
        late = controller.plain_tokens_first(state, self.costs, drafter_prompt) if drafter_prompt else 0
        seconds, i, depths = self.prefill_s(0 if late else drafter_prompt), 1, [0] * (self.settings.max_depth + 1)
        timed, costs, forwards = StepTimings(self.table), self.costs, 0
        while i < len(answer):
            if forwards and forwards % calibration.RESCALE_EVERY == 0:  # after the step that made it so
                costs = self.timings.merged(timed).costs()
            remaining, context = len(answer) - i, prompt + i
            if late and i >= late:
                late, drafter_prompt = 0, controller.drafter_prefill_tokens(
                    state, costs, prompt, new - i, WINDOWS, expected_tokens=expected_tokens(lengths, i, new))
                seconds += self.prefill_s(drafter_prompt)
            if not drafter_prompt or late:
                seconds += self.step_s(0, 0, context)
                self.time(timed, 0, 0, context, 0)
                forwards += 1
                i += 1
                continue
            plan = controller.choose(state, costs, remaining, context=context)
            behind = state.behind
            drafted, k = 0, plan.size
            if plan.depth:
                keep = controller.chain_rule(state, costs, plan, context)
                limit = min(plan.drafts, remaining - 1)
                while drafted < limit:
                    drafted += 1
                    if not keep(record["probs"][k][i + drafted - 1]):
                        break
            accepted = _accepted(record, k, i, drafted)
            emitted = min(accepted + 1, remaining)
            drawn = ([1.0] * accepted + [0.0])[:drafted]
            controller.observe(state, controller.Plan(drafted, k, plan.probe), accepted,
                               record["ranks"][i : i + emitted], None, drawn)
            step_s = self.step_s(drafted, k, context, behind)
            controller.count_saving(state, costs, drafted, k, emitted, context, behind, plan.finding_out,
                                    step_s if drafted else None)
            seconds += step_s
            self.time(timed, drafted, k, context, behind)
            forwards += 1
            depths[drafted] += 1
            if steps:
                print(f"    token {i:4d}: chose {plan.depth} (up to {plan.longest}) at {k}, drafted {drafted}, "
                      f"accepted {accepted}; agreement by position "
                      f"{[round(state.agreement(p), 2) for p in range(3)]}")
            i += emitted
        self.confidence = controller.carried_confidence(state)
        self.worth[kind] = controller.carry_worth(self.worth.get(kind), state, drafter_prompt == prompt)
        self.worth["setting"] = controller.carry_worth(self.worth.get("setting"), state, drafter_prompt == prompt)
        self.worth[(kind, "window")] = controller.carry_worth(self.worth.get((kind, "window")), state,
                                                              0 < drafter_prompt < prompt)
        self.lengths[kind] = add_answer(lengths, len(answer), len(answer) >= new)
        self.timings.merge(timed)
        self.costs = self.timings.costs()
        return seconds, drafter_prompt, depths


def _accepted(record: dict, k: int | None, start: int, depth: int) -> int:
    """How many of a chain's `depth` picks from answer position `start` at map size k match the answer."""
    n = 0
    while n < depth and record["picks"][k][start + n] == record["answer"][start + n]:
        n += 1
    return n


def replay(args) -> None:
    for assignment in args.set:
        name, value = assignment.split("=", 1)
        if not hasattr(controller, name):
            sys.exit(f"decode/controller.py has no {name}")
        setattr(controller, name, type(getattr(controller, name))(value))
    data = torch.load(args.drafts, weights_only=False)
    run = json.load(open(args.costs))
    section = run["meta"]["sections"]
    section = section[0] if isinstance(section, list) else next(iter(section.values()))
    costs = StepCosts.from_dict(next(iter(section["controller_costs"].values())))
    sizes = tuple(data["sizes"])
    rows = (None, *STATIC_SIZES, sizes[-1])
    names = {None: "vanilla", sizes[-1]: "k=3 no map", **{k: f"k=3 map={k}" for k in STATIC_SIZES}}
    # A table off where decisions turn: the target's forwards over 2 rows and more take `--truth-rows-scale` times
    # what the table says (on the AVX2-only EPYC the engine's own forwards rescaled 2 rows by x1.07-x1.29).
    truth = recalibrated(costs, {1: 1.0, 2: args.truth_rows_scale}) if args.truth_rows_scale != 1.0 else None
    player = Replay(costs, sizes, data.get("coverage") or {}, truth)
    totals: dict[str, dict] = {}
    for record in data["records"]:
        # The cap the answers were generated under: an answer shorter than it ended at an EOS.
        new = args.max_new_tokens or data.get("max_new_tokens") or len(record["answer"])
        if args.steps:
            print(record["id"])
        auto, drafter_prompt, depths = player.auto(record, new, args.steps)
        static = {k: player.static(record, new, k) for k in rows}
        best = min(static, key=static.get)
        window = "W" if 0 < drafter_prompt < record["prompt_tokens"] else " "
        print(f"{record['id'][-28:]:28s} prompt {record['prompt_tokens']:5d} drafter {drafter_prompt:5d}{window} "
              f"auto/best static {static[best] / auto:.3f} ({names[best]}), /vanilla {static[None] / auto:.3f}, "
              f"/no map {static[sizes[-1]] / auto:.3f}; steps per drafted length {depths}")
        for dataset in (record["id"].split("-")[0], "all"):
            total = totals.setdefault(dataset, {"auto": 0.0, **{k: 0.0 for k in rows}})
            total["auto"] += auto
            for k in rows:
                total[k] += static[k]
    line = []
    for dataset, total in totals.items():
        best = min(rows, key=lambda k: total[k])
        line.append(f"{dataset} {total[best] / total['auto']:.3f} ({names[best]}; no map "
                    f"{total[sizes[-1]] / total['auto']:.3f})")
    print("auto / best static row, by dataset:", " | ".join(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("drafts", help="teacher-forced drafts of a mix's prompts")
    d.add_argument("out")
    d.add_argument("--mix", default="mtbench,code,multilingual")
    d.add_argument("--num-prompts", type=int, default=18)
    d.add_argument("--max-new-tokens", type=int, default=256)
    d.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    d.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    d.add_argument("--quant", default=None, help="int4 or int8, as the bench's --quant")
    d.add_argument("--answers", nargs="*", default=[], help="bench results.json files with a vanilla row")
    d.add_argument("--threads", type=int, default=2)
    r = sub.add_parser("replay", help="replay the controller over the drafts")
    r.add_argument("drafts")
    r.add_argument("--costs", required=True, help="a bench results.json with the auto row's controller_costs")
    r.add_argument("--max-new-tokens", type=int, default=None)
    r.add_argument("--set", action="append", default=[], help="NAME=VALUE: a decode/controller.py constant")
    r.add_argument("--steps", action="store_true", help="print every step")
    r.add_argument("--truth-rows-scale", type=float, default=1.0,
                   help="time steps with the target's forwards over 2+ rows this many times the table's (the "
                        "controller still decides at the table): a table off where drafting's choices turn")
    args = parser.parse_args()
    drafts(args) if args.command == "drafts" else replay(args)


if __name__ == "__main__":
    main()
