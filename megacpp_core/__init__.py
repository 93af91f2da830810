"""MegaCpp domain library: one module per pipeline stage, no orchestrator imports.

Stages (SPEC §4): ``acquire`` (0), ``quality`` (1), ``license`` (2), ``scrub`` (3),
``dedup`` (4), ``tokenizer`` (5), ``chunk`` (6), ``chunk_dedup`` (7), ``tokenize`` (8),
``pack`` (9), ``megatron`` (10; ``megatron_merge`` joins per-shard datasets). ``card``
renders the dataset card.

Importing this package makes jemalloc arrow's memory pool for the process
(``ARROW_DEFAULT_MEMORY_POOL``, unless the environment already names one). Arrow reads the
variable once, when pyarrow is first imported, so it is set here, before any module of the
package imports pyarrow. Arrow's own default (mimalloc) keeps the pages of freed large
buffers resident: a revision holding one 12 MB file peaked at 270 MB in the acquire step
under mimalloc and at 242 MB under jemalloc, against 216 and 202 MB for a revision of small
files (``python bench/scale.py --child acquire …``, pyarrow 26).

It also fixes glibc malloc's mmap threshold at :data:`MMAP_THRESHOLD` (``mallopt``): numpy
takes its arrays from malloc, whose threshold otherwise rises with every large block freed
(up to 32 MiB), so the next blocks of that size come from the heap and the heap's
high-water mark stays resident. The LSH step over 6.4 M files peaked at 456 MB with the
dynamic threshold (``bench/dedup_scale.py``).
"""

import os as _os

_os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

#: Blocks of at least this many bytes are mmapped and unmapped when freed (glibc's default
#: starts at 128 KiB and rises dynamically; setting it fixes it). Implementation choice.
MMAP_THRESHOLD = 1 << 20


def _fix_mmap_threshold() -> bool:
    """``mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)`` on glibc; False elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD))  # -3: M_MMAP_THRESHOLD (malloc.h)
    except (OSError, AttributeError):
        return False


MMAP_THRESHOLD_FIXED = _fix_mmap_threshold()

SCHEMA_VERSION = "1"
PRODUCER_REVISION = "megacpp-data 0.1.0"
