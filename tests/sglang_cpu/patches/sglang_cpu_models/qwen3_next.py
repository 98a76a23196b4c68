# TEST HARNESS ONLY -- never shipped in the hicache_galahad package.
"""Re-export SGLang's own Qwen3-Next class for the registry (see __init__.py), but only when the
hybrid patches are on (``gdn_ops`` in ``SGLANG_CPU_TEST_PATCHES``, which ``run`` adds for a
hybrid model).

Importing ``sglang.srt.models.qwen3_next`` pulls in the MoE and gated-delta-net layers, which
costs every Llama server start-up time, and without the ``gdn_ops`` patch the GDN backend cannot
even be imported on CPU. Without ``EntryClass`` the registry simply falls back to importing all
built-in models for this architecture.
"""

import os

if "gdn_ops" in [name.strip() for name in os.environ.get("SGLANG_CPU_TEST_PATCHES", "").split(",")]:
    from sglang.srt.models.qwen3_next import Qwen3NextForCausalLM

    EntryClass = Qwen3NextForCausalLM
