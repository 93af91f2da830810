"""Dagster ``ConfigurableResource`` wrappers around the tools the stages use."""

from .data_root import DataRootResource
from .scancode import ScanCodeResource

__all__ = ["DataRootResource", "ScanCodeResource"]
