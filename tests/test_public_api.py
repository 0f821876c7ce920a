"""The small public API: `from frspec import ...` gives the documented names, and `import frspec` stays light."""

from __future__ import annotations

import subprocess
import sys

import frspec


def test_import_frspec_does_not_import_torch():
    code = "import sys, frspec; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_public_names_are_the_owning_modules_objects():
    from frspec.decode.factory import build_generator
    from frspec.decode.sampling import SamplingParams
    from frspec.decode.tree_shape import TreeShape
    from frspec.models.loading import load_model
    from frspec.models.tokenizer import load_tokenizer
    from frspec.vocab.draft_vocab import DraftVocab
    from frspec.vocab.token_map import TokenMap

    assert frspec.build_generator is build_generator and frspec.SamplingParams is SamplingParams
    assert frspec.TreeShape is TreeShape and frspec.load_model is load_model
    assert frspec.load_tokenizer is load_tokenizer and frspec.TokenMap is TokenMap and frspec.DraftVocab is DraftVocab
    assert all(hasattr(frspec, name) for name in frspec.__all__)


def test_unknown_names_raise_attribute_error():
    try:
        frspec.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("frspec.no_such_name should not exist")
