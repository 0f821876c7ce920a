"""Code-completion benchmark prompts from the held-out tenth of the standard library (vocab/code_corpus.py): the
start of a real Python file, the model asked to continue it, the rest of the file as `reference`.

The files are never part of the code corpus's build slice, so a code map counted on that slice is measured on code
it has not seen. Deterministic: the corpus's hashed file order, the first files long enough.
"""

from __future__ import annotations

from frspec.bench.prompt import Prompt
from frspec.errors import FrspecError

CODE_TEMPLATE = "Continue this Python file from where it stops. Reply with code only.\n\n```python\n{head}"
DEFAULT_HEAD_CHARS = 4000  # ~1k tokens of code before the cut
DEFAULT_REFERENCE_CHARS = 2000
DEFAULT_CODE_PROMPTS = 16


def cut_at_line(text: str, chars: int) -> int:
    """The position of the first line break at or after `chars` (the whole text if none)."""
    i = text.find("\n", chars)
    return len(text) if i < 0 else i + 1


def load_code_completion(
    num_prompts: int = DEFAULT_CODE_PROMPTS,
    head_chars: int = DEFAULT_HEAD_CHARS,
    reference_chars: int = DEFAULT_REFERENCE_CHARS,
    roots=None,
) -> list[Prompt]:
    """`num_prompts` held-out stdlib files long enough for a `head_chars` head and a `reference_chars` reference,
    each cut at a line break."""
    from frspec.vocab.code_corpus import code_slices

    if num_prompts <= 0 or head_chars <= 0 or reference_chars <= 0:
        raise FrspecError("the number of code prompts and their lengths must be positive")
    _, heldout = code_slices(roots=roots)
    prompts = []
    for f in heldout.files:
        try:
            text = f.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        cut = cut_at_line(text, head_chars)
        end = cut_at_line(text, cut + reference_chars)
        if end - cut < reference_chars:
            continue
        prompts.append(Prompt(id=f"code-{f.key}", text=CODE_TEMPLATE.format(head=text[:cut]), category="code",
                              reference=text[cut:end]))
        if len(prompts) == num_prompts:
            return prompts
    raise FrspecError(f"found only {len(prompts)} held-out stdlib files of at least {head_chars + reference_chars} "
                      f"characters, not {num_prompts}")
