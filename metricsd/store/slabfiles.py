"""The chunk arenas' slabs as files under ``<data-dir>/chunks/``, so that their pages are page cache
and not the process's anonymous memory.

A store keeps its compressed chunks in 4 MiB slabs (metricsd/store/arena.py). Anonymous slabs
count in the process's RSS for as long as they live: at 200,000 series x 2 h the sealed chunks
were 138 MiB of a 336 MiB process, where VictoriaMetrics keeps its data in files that the kernel
caches and drops as it needs (perf/RESULTS.md, session 42 and "Session 40, s40-25"). With a data
directory each slab is instead a shared mapping of a file of its own, and a slab the store no
longer writes to is dropped from the resident set with ``madvise(MADV_DONTNEED)`` (the arena does
that): for a shared file mapping the bytes stay in the page cache (and, once written back, in
the file), and a later read faults the page back in as a minor fault. Prometheus keeps its head
chunks in memory-mapped files the same way.

Why visible files, not files unlinked right after they are mapped: an operator looking at what
uses the disk sees ``<data-dir>/chunks/*.slab`` and their sizes. They are scratch: durability
stays the WAL and the snapshots, nothing in recovery reads them. A file is removed when its slab
is given up (views still held, e.g. a snapshot being written, keep the mapping and so the inode
until they are released), every one at a clean close, and any left by a crash at the next start
(under the data directory's lock, so never another process's).

Disk full. A write to a page of a shared file mapping whose block cannot be allocated raises
SIGBUS and kills the process. So every file is ``posix_fallocate``d to its full size before it is
mapped: the blocks are reserved, and a full disk shows as an OSError here, when the slab is
made. :meth:`SlabFiles.map` then answers None and the arena takes an anonymous slab instead (a
warning logged once until files work again, counted in ``fallbacks``): the store keeps accepting
and answering, nothing is lost, it only holds that slab in anonymous memory. The same happens for
any other OSError.

Descriptors. Each mapping holds one (Python 3.11's mmap keeps a dup of the file's), so slab files
could take the descriptors a store needs for its sockets, WAL segments and snapshots: a store
whose chunk files reached the open-files limit would refuse connections. So at most a quarter of
the soft limit (``RLIMIT_NOFILE``, read at start; 1,024 by default under systemd: 256 files,
1 GiB of slabs) are files; past it, slabs are anonymous (logged once, counted in ``fallbacks``),
and an operator who wants more chunk pages out of the RSS raises ``ulimit -n``.

Not safe for concurrent use; the store serialises access.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import resource
from pathlib import Path

__all__ = ["SUFFIX", "SlabFiles"]

SUFFIX = ".slab"
DESCRIPTOR_SHARE = 4  # at most 1/this of the soft open-files limit goes to slab files
log = logging.getLogger("metricsd.store.slabfiles")


class SlabFiles:
    """A directory of slab files: :meth:`map` makes one, :meth:`give_up` removes it."""

    def __init__(self, where: Path, max_files: int | None = None) -> None:
        """Creates ``where`` if missing and removes the slab files a previous process left in it.
        ``max_files``: the most files at once (default: a quarter of the soft open-files limit)."""
        where.mkdir(parents=True, exist_ok=True)
        for old in where.glob(f"*{SUFFIX}"):
            old.unlink(missing_ok=True)
        self.where = where
        self._names = itertools.count()
        # id(mapping) -> (the mapping, its file), for those made and not given up. The mapping itself is
        # held, so that its id cannot be reused by an anonymous one that :meth:`owns` would then claim.
        self._maps: dict[int, tuple[mmap.mmap, Path]] = {}
        self.fallbacks = 0  # slabs that could not be files (a full disk) and went to anonymous memory
        self.max_files = max_files if max_files is not None else _descriptor_budget()
        self._failing = False

    def map(self, n: int) -> mmap.mmap | None:
        """A shared mapping of a new file of ``n`` bytes, its blocks reserved; None when the file
        could not be made (logged): the caller takes an anonymous slab."""
        if len(self._maps) >= self.max_files:
            self._fall_back(OSError(f"{self.max_files} slab files open, a quarter of the open-files limit "
                                    f"(raise ulimit -n for more)"))
            return None
        path = self.where / f"{next(self._names):08d}{SUFFIX}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            self._fall_back(e)
            return None
        try:
            os.posix_fallocate(fd, 0, n)  # ENOSPC here, not SIGBUS on a later write to the mapping
            m = mmap.mmap(fd, n)  # MAP_SHARED, read and write
        except OSError as e:
            path.unlink(missing_ok=True)
            self._fall_back(e)
            return None
        finally:
            os.close(fd)  # the mapping keeps the file (and Python's mmap a descriptor of its own)
        if self._failing:
            self._failing = False
            log.warning("chunk slabs are files under %s again", self.where)
        self._maps[id(m)] = (m, path)
        return m

    def _fall_back(self, e: OSError) -> None:
        self.fallbacks += 1
        if not self._failing:
            self._failing = True
            log.warning("a chunk slab file under %s could not be made (%s): slabs go to anonymous memory "
                        "until it can", self.where, e)

    def owns(self, m: mmap.mmap) -> bool:
        """Whether ``m`` is one of this directory's file mappings, whose pages DONTNEED may drop
        (an anonymous one's would stay in shared memory, only hidden from the RSS)."""
        return id(m) in self._maps

    def give_up(self, m: mmap.mmap) -> None:
        """``m``'s file removed (the mapping itself stays valid while anything holds it)."""
        held = self._maps.pop(id(m), None)
        if held is not None:
            with contextlib.suppress(OSError):
                held[1].unlink()

    def clear(self) -> None:
        """Every file removed (a clean close; a store abandoned during recovery)."""
        for _, path in self._maps.values():
            with contextlib.suppress(OSError):
                path.unlink()
        self._maps.clear()

    @property
    def file_bytes(self) -> int:
        """Bytes of the files made and not given up (their blocks are reserved on disk)."""
        return sum(len(m) for m, _ in self._maps.values())

    @property
    def files(self) -> int:
        return len(self._maps)


def _descriptor_budget() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(1, soft // DESCRIPTOR_SHARE)
