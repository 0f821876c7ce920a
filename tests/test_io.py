import pytest

from frspec.io import atomic_path


def test_atomic_path_renames_on_success(tmp_path):
    out = tmp_path / "sub" / "file.txt"
    with atomic_path(out) as tmp:
        tmp.write_text("hello")
        assert not out.exists()
    assert out.read_text() == "hello"
    assert list(out.parent.iterdir()) == [out]


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "file.txt"
    out.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    assert out.read_text() == "old"
    assert list(tmp_path.iterdir()) == [out]


def test_atomic_path_output_has_umask_permissions(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        out = tmp_path / "map.pt"
        with atomic_path(out) as tmp:
            tmp.write_bytes(b"x")
        assert (out.stat().st_mode & 0o777) == 0o644
    finally:
        os.umask(old)
