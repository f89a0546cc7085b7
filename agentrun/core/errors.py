"""Contract errors: every one is an ``AgentRunError`` whose ``code`` names it (docs/api.md#errors)."""

from __future__ import annotations

from typing import Any

HTTP_STATUS: dict[str, int] = {
    "INVALID_REQUEST": 400,
    "INVALID_PER_PAGE": 400,
    "INVALID_PAGE": 400,
    "INVALID_DATE": 400,
    "INVALID_METADATA": 400,
    "ARGS_INVALID": 400,
    "RESUME_DATA_INVALID": 400,
    "AMBIGUOUS_TOOL_CALL": 400,
    "TOOL_CALL_NOT_SUSPENDED": 400,
    "WRONG_DECISION_KIND": 400,
    "NOT_AUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "AGENT_NOT_FOUND": 404,
    "RUN_NOT_FOUND": 404,
    "NOT_FOUND": 404,
    "TOOL_CALL_ALREADY_DECIDED": 409,
    "RUN_NOT_SUSPENDED": 409,
    "ARGS_CHANGED": 409,
    "ALREADY_APPROVED": 409,
    "FINGERPRINT_REQUIRED": 428,
    "PAYLOAD_TOO_LARGE": 413,
    "SERVICE_UNAVAILABLE": 503,  # the database or the channel layer is unreachable (core/outages.py)
}


class AgentRunError(Exception):
    """An error of the contract; ``code`` is one of ``HTTP_STATUS``'s keys."""

    def __init__(self, code: str, message: str, *, details: dict[str, Any] | None = None) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            error["details"] = self.details
        return {"error": error}

    def __repr__(self) -> str:
        return f"AgentRunError({self.code!r}, {self.message!r})"
