import pytest

from frspec.bench.methods import DRAFT, FRSPEC, VANILLA, Method, plan_methods
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError


def test_plan_has_vanilla_then_each_drafter_followed_by_its_frspec_maps():
    methods = plan_methods([1, 3], [8, 16])
    assert [m.label for m in methods] == [
        "vanilla",
        "draft k=1", "fr-spec k=1 map=8", "fr-spec k=1 map=16",
        "draft k=3", "fr-spec k=3 map=8", "fr-spec k=3 map=16",
    ]
    assert methods[2].same_drafter_without_frspec == Method.drafting(DRAFT, TreeShape.chain(1))
    assert methods[1].same_drafter_without_frspec is None


def test_plan_without_draft_is_vanilla_only():
    assert plan_methods([3], [8], has_draft=False) == [Method(VANILLA)]


@pytest.mark.parametrize("ks, sizes", [([0], [8]), ([3, 3], [8]), ([3], [8, 8]), ([3], [0])])
def test_plan_rejects_bad_lists(ks, sizes):
    with pytest.raises(FrspecError):
        plan_methods(ks, sizes)


def test_method_fields_must_match_kind():
    with pytest.raises(ValueError):
        Method(FRSPEC, 3, tree=TreeShape.chain(3))  # no map
    with pytest.raises(ValueError):
        Method(VANILLA, 3)
    with pytest.raises(ValueError):
        Method(DRAFT, 3, 8, TreeShape.chain(3))  # a map on the plain drafter
    with pytest.raises(ValueError):
        Method("medusa", 3)


def test_plan_with_draft_trees_and_eagle_shapes():
    from frspec.decode.tree_shape import TreeShape

    methods = plan_methods(
        [3], [8], draft_tree_shapes=[TreeShape.static(2, 2), TreeShape.chain(3)],
        eagle_tree_shapes=[TreeShape.chain(4), TreeShape.dynamic(5, 4, 24)], eagle_token_map_sizes=[16],
    )
    assert [m.label for m in methods] == [
        "vanilla",
        "draft k=3", "fr-spec k=3 map=8",  # the draft tree "chain-3" is this plain chain, not repeated
        "draft static-2x2", "fr-spec static-2x2 map=8",
        "eagle chain-4", "eagle+fr-spec chain-4 map=16",
        "eagle dynamic-5x4x24", "eagle+fr-spec dynamic-5x4x24 map=16",
    ]
    assert [m.tree_label for m in methods] == [
        None, "chain-3", "chain-3", "static-2x2", "static-2x2", "chain-4", "chain-4", "dynamic-5x4x24", "dynamic-5x4x24"]
    assert [m.num_spec_tokens for m in methods[1:]] == [3, 3, 2, 2, 4, 4, 5, 5]
    # FR-Spec is judged against the same drafter and shape without a map.
    assert methods[4].same_drafter_without_frspec == methods[3]
    assert methods[6].same_drafter_without_frspec == methods[5]
    assert methods[8].same_drafter_without_frspec == methods[7]
    assert methods[5].same_drafter_without_frspec is None
    assert methods[1].tree == TreeShape.chain(3) and methods[5].tree == TreeShape.chain(4)  # one spelling of a chain
    # Without a draft model only the EAGLE rows remain.
    eagle_only = plan_methods([3], [8], has_draft=False, eagle_tree_shapes=[TreeShape.chain(2)])
    assert [m.label for m in eagle_only] == ["vanilla", "eagle chain-2"]


def test_eagle_and_tree_methods_are_validated():
    from frspec.bench.methods import EAGLE, EAGLE_FRSPEC
    from frspec.decode.tree_shape import TreeShape

    with pytest.raises(ValueError):
        Method(EAGLE, 4)  # EAGLE always names its shape
    with pytest.raises(ValueError):
        Method(EAGLE_FRSPEC, 4, tree=TreeShape.chain(4))  # no map
    with pytest.raises(ValueError):
        Method(EAGLE, 3, tree=TreeShape.chain(4))  # depth mismatch
    with pytest.raises(ValueError):
        Method(DRAFT, 4)  # a draft model's chain names its shape too (TreeShape.chain)
    assert Method.drafting(DRAFT, TreeShape.chain(4)) == Method(DRAFT, 4, tree=TreeShape.chain(4))
    with pytest.raises(FrspecError):
        plan_methods([3], [8], eagle_tree_shapes=[TreeShape.chain(2)], eagle_token_map_sizes=[16, 16])


def test_mtp_rows_are_head_rows_of_their_own_kind():
    """head_kind "mtp": the head rows of a checkpoint's MTP layers, judged against the same MTP drafter without the
    map (never an EAGLE row); an unknown head kind is refused."""
    from frspec.bench.methods import MTP, MTP_FRSPEC
    from frspec.decode.tree_shape import TreeShape

    methods = plan_methods([3], [8], has_draft=False, eagle_tree_shapes=[TreeShape.static(2, 2)],
                           eagle_token_map_sizes=[16], auto=True, head_kind=MTP)
    assert [m.label for m in methods] == ["vanilla", "mtp static-2x2", "mtp+fr-spec static-2x2 map=16",
                                          "mtp+fr-spec static-2x2 map=auto (maps <= 16 or none)"]
    assert all(m.uses_eagle for m in methods[1:])  # drafted from the target's hidden states, in the head slot
    assert methods[2].same_drafter_without_frspec == Method(MTP, 2, tree=TreeShape.static(2, 2))
    assert methods[3].kind == MTP_FRSPEC and methods[3].auto
    with pytest.raises(ValueError):
        Method(MTP, 2)  # a head names its shape
    with pytest.raises(ValueError):
        plan_methods([3], [8], eagle_tree_shapes=[TreeShape.chain(2)], head_kind="medusa")
