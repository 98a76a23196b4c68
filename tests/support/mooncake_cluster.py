"""The real Mooncake cluster of the tests, under the name the tests import it by: this module
*is* bench/mooncake_cluster.py (the same module object, so its record of the processes it
started, and a test that patches a name here, are the benchmarks' too), which bench/ imports
without importing anything from tests/."""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.append(_REPO)  # after tests/, so that `support` and the rest stay the tests'

from bench import mooncake_cluster  # noqa: E402

sys.modules[__name__] = mooncake_cluster
