"""The OpenAI-shaped error envelope, built in one place (llama-server's format_error_response).

Every error reply is `{"error": {"code": <status>, "message": ..., "type": ...}}` with the
HTTP status equal to `code`; `ApiError.extra` adds fields such as `n_prompt_tokens`.
"""

from __future__ import annotations

from typing import Any

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "not_found_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """An error answered to the client as-is (status, one-line message, envelope type)."""

    def __init__(self, status: int, message: str, type_: str | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type = type_ or ERROR_TYPES.get(status, "server_error")
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type,
                          **self.extra}}


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def context_exceeded(n_prompt: int, n_ctx: int) -> ApiError:
    return ApiError(
        400, f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens),"
        " try increasing it", "exceed_context_size_error", n_prompt_tokens=n_prompt, n_ctx=n_ctx)


LOADING = ApiError(503, "Loading model")
NOT_FOUND = ApiError(404, "File Not Found")
BAD_KEY = ApiError(401, "Invalid API Key")
CANCELLED = ApiError(499, "request cancelled by the client")
SHUTTING_DOWN = ApiError(503, "The server is shutting down")
