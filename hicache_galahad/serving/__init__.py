"""The SGLang HiCache backend: `GalahadStorage` (adapter.py), the host pools bound to their
namespaces (binding.py), the byte ranges of a page in a pool (pages.py) and the moves between
pools and the store (transfer.py).

The only package that imports torch or SGLang (this file imports neither, so that the
package's other users can name it). Imports every layer below it: `tier`, `store`,
`record`, `telemetry`, `config`, the project's errors and `checkpoint`.
"""
