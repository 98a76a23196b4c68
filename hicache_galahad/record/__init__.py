"""What a record is, apart from any file: the format and its rules (V1-V16), a store's codec
settings (digest, zstd, AES-256-GCM), zstd itself, the tenant keys and the namespace hash.

Pure: no torch, no SGLang, and no file I/O except key files (`crypto.read_key_file`).
Imports only `hicache_galahad.errors` and `hicache_galahad.units` from the project.
"""
