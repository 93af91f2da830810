"""Pandera schemas, one module per stage table (SPEC §2: ``megacpp_checks`` holds the
schemas of every table). Each module exposes a pandera ``DataFrameModel`` or
``DataFrameSchema`` and a ``validate_*`` helper used by the blocking asset checks."""
