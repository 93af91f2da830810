"""The code location with the chunk_dedup stage's ``code_version`` bumped to
:data:`BUMPED`, as after a change of that stage's code (loaded by the UI test's workspace)."""

import dataclasses

from megacpp_assets.definitions import build_definitions
from megacpp_core.stages import STAGES

BUMPED = "ui-3"
STAGES_BUMPED = tuple(dataclasses.replace(s, code_version=BUMPED) if s.name == "chunk_dedup" else s for s in STAGES)
defs = build_definitions(STAGES_BUMPED)
