"""The store's write-ahead log: ``record`` is the byte codec, ``log`` the segment files."""

from metricsd.store.wal.log import FsyncPolicy, WalError, WalPosition, WalStats, WriteAheadLog
from metricsd.store.wal.record import RecordType

__all__ = ["FsyncPolicy", "RecordType", "WalError", "WalPosition", "WalStats", "WriteAheadLog"]
