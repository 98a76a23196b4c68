# TEST HARNESS ONLY -- never shipped in the hicache_galahad package.
"""Start-up shortcut for the CPU harness: a tiny SGLang model package.

``tests/sglang_cpu/run`` sets ``SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_cpu_models`` (unless it is
already set). SGLang's model registry then registers only the model classes re-exported here
and defers importing its ~200 built-in model modules. This is a pure speed-up: an architecture
not listed here makes the registry fall back to loading all built-in models, as usual.
"""
