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
"""

import os as _os

_os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

SCHEMA_VERSION = "1"
PRODUCER_REVISION = "megacpp-data 0.1.0"
