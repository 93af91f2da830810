"""MegaCpp domain library: one module per pipeline stage, no orchestrator imports.

Stages (SPEC §4): ``acquire`` (0), ``quality`` (1), ``license`` (2), ``scrub`` (3),
``dedup`` (4), ``tokenizer`` (5), ``chunk`` (6), ``chunk_dedup`` (7), ``tokenize`` (8),
``pack`` (9), ``megatron`` (10; ``megatron_merge`` joins per-shard datasets). ``card``
renders the dataset card.
"""

SCHEMA_VERSION = "1"
PRODUCER_REVISION = "megacpp-data 0.1.0"
