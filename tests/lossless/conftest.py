import sys
from pathlib import Path

# The tiny models and EAGLE heads of the engine tests (spec_tiny, eagle_tiny) are reused, not duplicated. They live in
# tests/spec until the decode redesign and in tests/decode after it. Appended, so this directory's modules win.
for _shared in ("decode", "spec"):
    if (Path(__file__).resolve().parents[1] / _shared).is_dir():
        sys.path.append(str(Path(__file__).resolve().parents[1] / _shared))
