# TEST HARNESS ONLY -- never shipped in the hicache_galahad package.
"""Re-export SGLang's own DeepSeek-V2/V3 classes for the registry (see __init__.py), but only
when the MLA patch is on (``mla_torch_native`` in ``SGLANG_CPU_TEST_PATCHES``, which ``run``
adds for a DeepSeek model): importing ``sglang.srt.models.deepseek_v2`` costs every other
server start-up time. Without ``EntryClass`` the registry falls back to all built-in models."""

import os

if "mla_torch_native" in [
    name.strip() for name in os.environ.get("SGLANG_CPU_TEST_PATCHES", "").split(",")
]:
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM

    EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]
