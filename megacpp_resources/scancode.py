"""ScanCode toolkit wrapper: one license index and one header cache per process."""


from dagster import ConfigurableResource

from megacpp_core import pipeline
from megacpp_core.license import Scanner


class ScanCodeResource(ConfigurableResource):
    """Hands out the process-wide :class:`~megacpp_core.license.Scanner` (ScanCode's index
    takes seconds to load, so every revision materialized in a process shares it)."""

    def scanner(self) -> Scanner:
        return pipeline.shared_scanner()
