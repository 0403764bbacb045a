"""The worker runtime: claims jobs through the repository and runs their handlers."""

from server.runtime.context import JobContext
from server.runtime.registry import Handler, HandlerRegistry
from server.runtime.worker import Runtime, RuntimeSettings

__all__ = ["Handler", "HandlerRegistry", "JobContext", "Runtime", "RuntimeSettings"]
