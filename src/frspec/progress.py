"""Whether this process draws progress bars. `--no-progress` turns every bar off, frspec's and those of the
libraries it calls (transformers' weight loading, huggingface_hub's downloads), so that a log holds no bar at all.
Functions that take `progress=` keep it; this is the process-wide switch above them."""

from __future__ import annotations

import os
import sys

_shown = True


def hide_progress_bars() -> None:
    """From now on, no progress bar in this process."""
    global _shown
    _shown = False
    # huggingface_hub reads this when asked, and transformers when it is first imported...
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:  # ...so one already imported is told directly.
        from transformers.utils import logging

        logging.disable_progress_bar()


def progress_shown(progress: bool = True) -> bool:
    """Whether a bar asked for with `progress` is drawn."""
    return progress and _shown
