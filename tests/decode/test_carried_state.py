"""What a generator's requests carry to its next ones is kept between processes, beside the cached step costs."""

from __future__ import annotations

import json

from frspec.decode.carried_state import CarriedStore, carried_path
from frspec.decode.controller import CarriedWorth
from frspec.decode.answer_lengths import AnswerLengths
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams
from frspec.vocab.token_map import TokenMap
from tests.decode.spec_tiny import named_pair_ranking, named_tiny_pair

_RANKING = named_pair_ranking()


def test_a_new_generator_starts_from_what_the_last_ones_requests_carried(tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    target, draft = named_tiny_pair()
    first = build_generator(target, draft, _RANKING)
    assert first.carried() == ({}, {}, {})
    for n, sampling in ((5, SamplingParams()), (9, SamplingParams(temperature=1.0, seed=3))):
        first.generate(input_ids=list(range(3, 3 + n)), max_new_tokens=12, eos_token_ids=[], sampling=sampling)
    kept = first.carried()
    assert all(kept) and ("greedy",) in kept[0] and (1.0, 0, 1.0) in kept[0]
    store = first.carried_store
    assert store.path == carried_path(first.timings.path) and store.path.is_file()
    # A new process (here: a new generator) of the same pair, settings and ranking starts from it.
    again = build_generator(target, draft, _RANKING)
    assert again.carried() == kept
    # Another ranking (or other settings) learnt nothing it can use: it starts empty, and its requests replace the file.
    other = build_generator(target, draft, TokenMap(list(range(128)), 256))
    assert other.carried() == ({}, {}, {})
    # Costs given by the caller keep nothing between processes.
    given = build_generator(target, draft, _RANKING, costs=first.measured_costs)
    assert given.carried_store is None and given.carried() == ({}, {}, {})
    # Nor does a generator asked not to (the bench's: a run does not start from an earlier run on its prompts).
    assert build_generator(target, draft, _RANKING, carry_between_processes=False).carried_store is None


def test_the_store_round_trips_and_a_damaged_or_unwritable_file_costs_only_what_was_carried(tmp_path, caplog):
    store = CarriedStore(tmp_path / "carried" / "x.json", "tag")
    carried = ({("greedy",): ([0.5, 0.9], [2.0, 3.0])},
               {("greedy", 128, True): CarriedWorth(1.5, 2.0, 3.0, 4.0, 2.5), (1.0, 0, 1.0, 512, None, "window"):
                CarriedWorth()},
               {("greedy", 128, True): AnswerLengths(((12, False), (96, True)))})
    store.save(carried)
    assert store.load() == carried
    assert CarriedStore(store.path, "another").load() == ({}, {}, {})
    store.path.write_text(json.dumps({"tag": "tag", "confidence": "?"}), encoding="utf-8")
    assert store.load() == ({}, {}, {})
    store.path.write_text("{not json", encoding="utf-8")
    assert store.load() == ({}, {}, {})
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    with caplog.at_level("WARNING", logger="frspec"):
        CarriedStore(blocked / "carried" / "x.json", "tag").save(carried)  # a file where a folder should be
    assert any("could not keep what the requests taught the controller" in r.getMessage() for r in caplog.records)
