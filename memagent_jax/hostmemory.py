"""The host's memory as this process can use it, read from Linux's /proc (None elsewhere).

Standard library only: `data synthetic` checks its documents' size against it without JAX.
"""

from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes of memory this process can still take without the system running out: Linux's
    MemAvailable (what `free` calls available). None where there is no /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def usable_memory() -> int:
    """Bytes this process can hold in all: what it holds now (its resident set: the weights
    it loaded, among the rest) and what is still available; the machine's physical memory
    where /proc does not say."""
    available = available_memory()
    try:
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        available = None
    if available is None:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return available + resident
