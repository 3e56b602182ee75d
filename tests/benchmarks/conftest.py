"""benchmarks/ is not an installed package: `python -m pytest` from the repository's root
finds it; this makes a bare `pytest`, or one run from elsewhere, find it too."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
