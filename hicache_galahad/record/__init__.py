"""What a record is, apart from any file: the format and its rules (V1-V16), a store's codec
settings (digest, zstd, AES-256-GCM), the tenant keys and the namespace hash.

Pure: no torch, no SGLang, and no file I/O except the key file that `crypto.load_master_key`
names. Imports only `hicache_galahad.errors` and `hicache_galahad.units` from the project.
"""
