# TEST HARNESS ONLY -- never shipped in the hicache_galahad package.
"""Re-export SGLang's own Llama class for the registry (see __init__.py)."""

from sglang.srt.models.llama import LlamaForCausalLM

EntryClass = LlamaForCausalLM
