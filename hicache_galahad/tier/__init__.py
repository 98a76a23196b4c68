"""The shared tier: `TieredStore` (tiered.py), the local `RecordStore` first and a Mooncake
Store cluster for what it misses, and the Mooncake client itself (`mooncake/`).

No torch, no SGLang. Imports `store`, `record`, `telemetry`, `config` and the project's errors;
never the SGLang backend or the operator's command.
"""
