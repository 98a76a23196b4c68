"""`MooncakeTier` (tier.py): a Mooncake Store client that never raises or stalls, over its
parts: the registered buffers, the connection and its watch of the master, the bounded reads,
the write-behind puts, the integrity tag of shared values and the tier's counters. Its
options are `hicache_galahad.config.mooncake`.
"""
