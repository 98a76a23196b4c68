"""What is resolved once, at start, and refused loudly when wrong: the backend's options
(options.py), the `mooncake` option (mooncake.py) and the model's identity (fingerprint.py,
which reads the weights and configs of the model directory it is given).

No torch, no SGLang. Imports only the project's errors and units.
"""
