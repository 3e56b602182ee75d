"""The fast tier's service tests reuse tests/service's fakes (the app over a fake backend)."""

from __future__ import annotations

import sys
from pathlib import Path

SERVICE_TESTS = str(Path(__file__).resolve().parents[2] / "service")
if SERVICE_TESTS not in sys.path:
    sys.path.insert(0, SERVICE_TESTS)
