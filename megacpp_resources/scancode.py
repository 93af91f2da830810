"""ScanCode toolkit wrapper: one license index and one header cache per process."""


from dagster import ConfigurableResource

from megacpp_core.license import Scanner
from megacpp_core.stages.license import shared_scanner


class ScanCodeResource(ConfigurableResource):
    """Hands out the process-wide :class:`~megacpp_core.license.Scanner` (ScanCode's index
    takes seconds to load, so every revision materialized in a process shares it); the
    license stage asks for it as its ``scancode`` tool."""

    def scanner(self) -> Scanner:
        return shared_scanner()

    def tool(self) -> Scanner:
        """What the license stage's ``scancode`` tool is: the shared scanner."""
        return self.scanner()
