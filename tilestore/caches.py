"""Where tilestore keeps what later runs reuse: batch sizes, compiled graphs, slides staged
from URLs. One folder, chosen here."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache() -> Path:
    """TILESTORE_CACHE, else tilestore/ in the user's cache folder (XDG_CACHE_HOME, ~/.cache)."""
    root = os.environ.get("TILESTORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tilestore"
    )
    return Path(root)
