"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

Every error body is written by this server: it names the field or limit that was wrong and never
carries the client's input back (a prompt, a model name, a token id) nor internal text (exception
reprs, tracebacks; those go to the log). 429 and 503 carry `Retry-After`.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from g4bench.server import protocol as p

log = logging.getLogger(__name__)


class APIError(Exception):
    """Becomes `{"error": {...}}` with `status` (and `Retry-After: retry_after_s` when given)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        detail = p.ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return p.ErrorResponse(error=detail).model_dump()

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def validation_error(errors: list) -> APIError:
    """A 400 naming the invalid field and pydantic's description of what is wrong with it
    (pydantic's messages state the expectation, e.g. "Input should be less than or equal to 2";
    the offending input itself is left out). Of several errors the most specific (deepest) one is
    reported: for a union field pydantic reports each alternative, and the deepest is the one that
    got furthest (a content part without `text`, rather than "content should be a string")."""
    if not errors:
        return APIError(400, "invalid request")
    first = max(errors, key=lambda e: len(_field_path(e.get("loc", ()))))
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}")
    name = ".".join(_field_path(first.get("loc", ()))) or None
    return APIError(400, f"{name or 'body'}: {first['msg']}", param=name)


def _field_path(loc) -> list[str]:
    """The request-field part of a pydantic location: no "body" prefix, no union-branch tags
    such as "str", "list[str]" or "function-after[...]"."""
    tags = {"str", "int", "float", "bool", "list", "dict", "none"}
    return [str(x) for x in loc if x != "body" and not (isinstance(x, str) and ("[" in x or x in tags))]


def from_pydantic(exc: ValidationError) -> APIError:
    return validation_error(exc.errors(include_input=False, include_url=False))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(list(exc.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        messages = {404: "no such route", 405: "method not allowed on this route"}
        message = messages.get(exc.status_code, f"HTTP error {exc.status_code}")
        return APIError(exc.status_code, message, code=str(exc.status_code)).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return APIError(500, "internal server error (logged on the server)", "server_error").response()
