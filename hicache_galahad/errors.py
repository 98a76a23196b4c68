"""The exception tree: one root, configuration errors apart from data errors.

    GalahadError
      ConfigError          a setting is wrong: raised at start, naming the key and the value
        KeyFileError       the encryption key file is missing, malformed or too open
        FingerprintError   the model's weights cannot be identified
        MooncakeConfigError  a bad `mooncake` option (its key, value and what is expected)
      FormatError          a record that must not be served; `rule` names its docs/FORMAT.md rule
        NotARegularFileError   V0, and an OSError too: anything but a regular file (a FIFO,
                               a device, a directory, a link) where the store expects a
                               record or one of its own files (ledger, locks, counters)
        (one subclass per rule V1..V16, in format.py)
      LedgerWriteError     (an OSError) the byte ledger could not be written after records
                           were linked: `kept` bytes are on disk but not yet counted
      RefusedRequest       a caller's argument the backend refuses (a flat page of another
                           size): a miss or False, counted as a refusal, never as a bug
      PinsDirError         a directory under `<root>/pins/` is a link or not a directory: the
                           pin operation is refused (also a NotADirectoryError)
      OperatorError        a condition an operator can meet (no store there, a read-only
                           disk): `galahad` prints one line and exits 2
        ServerError        warm/ready: no server there, or one that answers too slowly, too
                           much, or something malformed

Data errors never leave the store: a record that raises a FormatError is a miss.
"""

from __future__ import annotations


class GalahadError(Exception):
    """Root of every error hicache_galahad raises on purpose."""


class ConfigError(GalahadError, ValueError):
    """A configuration mistake; raised at start, never during I/O."""


class KeyFileError(ConfigError):
    """The master key file is missing, malformed or readable by others."""


class FingerprintError(ConfigError):
    """The weights the cache belongs to cannot be established."""


class MooncakeConfigError(ConfigError):
    """A bad `mooncake` option: the message names the key, the value and what is expected."""


class FormatError(GalahadError):
    """A record that must not be served. `rule` names the FORMAT.md rule it broke."""

    rule = "V?"


class NotARegularFileError(FormatError, OSError):
    """Something other than a regular file (a FIFO, a device, a directory, a socket, a
    symbolic link) where the store expects a record (rule V0) or one of its own files. An
    OSError too: opening a metadata file fails with it as with any other I/O error."""

    rule = "V0"


class LedgerWriteError(GalahadError, OSError):
    """The ledger could not be written after records were linked: `kept` bytes of them are
    on disk but not yet counted (the caller carries them into its next update)."""

    def __init__(self, error: OSError, kept: int):
        super().__init__(error.errno, str(error))
        self.kept = kept


class RefusedRequest(GalahadError, ValueError):
    """An argument the backend refuses on purpose (a flat page that is not exactly one page
    of its pool): the call is a miss or False, counted in `adapter_errors` but never in
    `unexpected_errors`, which counts bugs only."""


class PinsDirError(GalahadError, NotADirectoryError):
    """A directory under `<root>/pins/` is a symbolic link or not a directory: never
    followed, the operation is refused (store/pins/tree.py)."""


class OperatorError(GalahadError):
    """A condition an operator can meet (no store there, a read-only disk, a bad argument):
    the `galahad` command prints it in one line and exits 2."""


class ServerError(OperatorError):
    """`warm`/`ready`: no SGLang server at the address, or one that answers past the deadline,
    more than the size cap, or something malformed; or no namespace of it under the root."""
