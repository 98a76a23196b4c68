# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# Python runs this file at start-up in every process that has tests/sglang_cpu/patches on
# PYTHONPATH (tests/sglang_cpu/run puts it there), including SGLang's scheduler and detokenizer
# subprocesses. It installs the runtime patches named in SGLANG_CPU_TEST_PATCHES (comma-separated;
# empty or unset: nothing is patched). See sglang_cpu_patches/ and tests/sglang_cpu/README.md.
# =================================================================================================
"""Install the opt-in SGLang-on-CPU test patches (test harness only)."""

import os

if os.environ.get("SGLANG_CPU_TEST_PATCHES", "").strip():
    import sglang_cpu_patches

    try:
        sglang_cpu_patches.install_from_env()
    except ValueError as exc:  # an unknown patch name: refuse to run half-patched
        raise SystemExit(f"sitecustomize (tests/sglang_cpu/patches): {exc}") from exc
