"""The virtual node's refusal of a pod it cannot run (pure)."""

from __future__ import annotations

from anex_agent.errors import AnexError


class Refusal(AnexError):
    """The pod asks for something the virtual node cannot give; ``field`` names where in the pod."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
