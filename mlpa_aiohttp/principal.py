"""Who the caller is, once authenticated."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class AuthMethod(enum.StrEnum):
    FXA = "fxa"
    DEV = "dev"
    APP_ATTEST = "app_attest"
    PLAY_INTEGRITY = "play_integrity"


@dataclass(frozen=True, slots=True)
class Principal:
    base_identity: str
    # A name of the loaded catalogue (validated with the headers).
    service_type: str
    purpose: str
    method: AuthMethod

    @property
    def user_id(self) -> str:
        """The LiteLLM end-user id: every method shares the `uid:service_type` namespace."""
        return f"{self.base_identity}:{self.service_type}"
