import pytest

from frspec.bench.methods import DRAFT, FRSPEC, VANILLA, Method, plan_methods
from frspec.errors import FrspecError


def test_plan_has_vanilla_then_each_drafter_followed_by_its_frspec_maps():
    methods = plan_methods([1, 3], [8, 16])
    assert [m.label for m in methods] == [
        "vanilla",
        "draft k=1", "fr-spec k=1 map=8", "fr-spec k=1 map=16",
        "draft k=3", "fr-spec k=3 map=8", "fr-spec k=3 map=16",
    ]
    assert methods[2].same_drafter_without_frspec == Method(DRAFT, 1)
    assert methods[1].same_drafter_without_frspec is None


def test_plan_without_draft_is_vanilla_only():
    assert plan_methods([3], [8], has_draft=False) == [Method(VANILLA)]


@pytest.mark.parametrize("ks, sizes", [([0], [8]), ([3, 3], [8]), ([3], [8, 8]), ([3], [0])])
def test_plan_rejects_bad_lists(ks, sizes):
    with pytest.raises(FrspecError):
        plan_methods(ks, sizes)


def test_method_fields_must_match_kind():
    with pytest.raises(ValueError):
        Method(FRSPEC, 3)
    with pytest.raises(ValueError):
        Method(VANILLA, 3)
    with pytest.raises(ValueError):
        Method(DRAFT, 3, 8)
    with pytest.raises(ValueError):
        Method("medusa", 3)
