import pytest

from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError

parse_tree_shapes = TreeShape.parse_list


def test_parse_and_label_each_kind():
    shapes = parse_tree_shapes("chain-4, static-3x2,DYNAMIC-5x4x24")
    assert shapes == (TreeShape.chain(4), TreeShape.static(3, 2), TreeShape.dynamic(5, 4, 24))
    assert [str(s) for s in shapes] == ["chain-4", "static-3x2", "dynamic-5x4x24"]  # the one printer
    assert ",".join(str(s) for s in shapes) == "chain-4,static-3x2,dynamic-5x4x24"
    assert all(TreeShape.parse(str(s)) == s for s in shapes)  # and the one parser reads it back
    assert parse_tree_shapes("static-2x1") == (TreeShape.chain(2),)  # branching 1 is a chain


@pytest.mark.parametrize(
    "text, message",
    [
        ("tree-3", "bad shape 'tree-3'; expected chain-D, static-DxB or dynamic-DxKxN"),
        ("chain-4,", "expected a comma-separated list"),
        ("", "expected a comma-separated list"),
        ("chain-0", "tree depth must be >= 1"),
        ("dynamic-5x4x0", "tree budget must be >= 1"),
        ("static-9x9", "limit 4096"),
        ("chain-3,chain-3", "duplicates"),
        ("static-3x", "bad shape"),
    ],
)
def test_bad_shapes_name_the_option(text, message):
    with pytest.raises(FrspecError) as e:
        parse_tree_shapes(text, "--draft-tree-shapes")
    assert message in str(e.value) and str(e.value).startswith("--draft-tree-shapes")
    assert "\n" not in str(e.value)
