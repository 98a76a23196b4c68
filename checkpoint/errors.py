"""Errors raised while decoding a recurrent-state record.

Every decoding failure is a `StateRecordError`; the caller turns it into a cache miss.
Programming errors on the encoding side (a payload of the wrong size, an invalid grid)
raise `ValueError` instead, because they are bugs rather than bad data.
"""


class StateRecordError(Exception):
    """A state record cannot be served: the caller must treat it as a miss."""


class TruncatedRecord(StateRecordError):
    """The record is shorter than its fixed header or than the lengths it declares."""


class TrailingBytes(StateRecordError):
    """The record is longer than header plus declared payload."""


class BadMagic(StateRecordError):
    """The record does not start with the state-record magic."""


class UnsupportedVersion(StateRecordError):
    """The record's format version is not one this reader understands."""


class MalformedHeader(StateRecordError):
    """The header is internally inconsistent (bad lengths, flags, dtype, padding, ...)."""


class PositionMismatch(StateRecordError):
    """The record holds the state at a different token position than requested."""


class GridMismatch(StateRecordError):
    """The record was written under a different page size or checkpoint interval."""


class GeometryMismatch(StateRecordError):
    """The record's components, shapes or layer count differ from the expected geometry."""


class DtypeMismatch(GeometryMismatch):
    """A component has the expected name and shape but a different dtype."""
