"""The SGLang server harness of the end-to-end tests, under the name the tests import it by:
this module *is* bench/sglang_server.py (the same module object, so a test that patches a
name here patches it there), which the benchmarks use too without importing anything from
tests/."""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.append(_REPO)  # after tests/, so that `support` and the rest stay the tests'

from bench import sglang_server  # noqa: E402

sys.modules[__name__] = sglang_server
