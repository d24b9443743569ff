"""OpenAI's error object, the one shape of every error under /v1/ (DESIGN.md §6).

The API's views answer their own errors (api.views.api_view); the handlers here answer
what Django itself refuses under /v1/ before or around a view (a bad Host, a failing
middleware), so no path under /v1/ ever answers an HTML page.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from inference.engine import failure_message
from infrastructure import logs
from infrastructure.metrics import API_ERRORS

logger = logging.getLogger(__name__)
ResponseT = TypeVar("ResponseT", bound=HttpResponseBase)

API_PREFIX = "/v1/"
# vLLM's paths, at the site's root as on vLLM: the API's all the same.
API_ROOT_PATHS = ("/tokenize", "/detokenize")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


class ApiError(Exception):
    """A refusal, answered as OpenAI's error object with its status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
        allow: Iterable[str] = (),
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.retry_after = retry_after
        self.allow = tuple(allow)  # a 405's methods

    def body(self) -> dict[str, Any]:
        error_type = "insufficient_quota" if self.code == "insufficient_quota" else ERROR_TYPES.get(self.status)
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        body = self.body()
        API_ERRORS.labels(str(self.status), self.code or body["error"]["type"] or "error").inc()
        response = JsonResponse(body, status=self.status)
        if self.retry_after is not None:
            response["Retry-After"] = str(self.retry_after)
        if self.allow:
            response["Allow"] = ", ".join(self.allow)
        return response


def request_id_of(request: HttpRequest) -> str:
    """The request's id, the one its log lines carry: the client's X-Request-Id when it is a
    plain token, else a new one. In front of a server chatsite.observability.RequestLog
    chose it; Django's test client has nothing in front, so it is chosen here."""
    if logs.REQUEST_LOGGED not in getattr(request, "scope", {}):
        logs.request_begin(request.headers.get("X-Request-Id"))
    return logs.request_id() or uuid.uuid4().hex


def body_too_large(limit: int) -> ApiError:
    """The refusal of a body over DATA_UPLOAD_MAX_MEMORY_SIZE: in the API's views, and in
    chatsite.body_limit before the body is read."""
    return ApiError(413, f"The request body is larger than the {limit} bytes allowed.", code="request_too_large")


def internal_error(request: HttpRequest, request_id: str) -> ApiError:
    """A 500 that tells the client where the log has it, and logs the exception being handled."""
    logger.exception("API request %s (%s %s) failed", request_id, request.method, request.path)
    return ApiError(500, failure_message(request_id))


def invalid_url(request: HttpRequest) -> ApiError:
    return ApiError(404, f"Invalid URL ({request.method} {request.path}).")


def finish(response: ResponseT, request_id: str) -> ResponseT:
    """The headers of every API response."""
    response["X-Request-Id"] = request_id
    return response


Handler = Callable[..., HttpResponse]


def is_api_path(path: str) -> bool:
    """Whether `path` (without the script prefix) is the API's, answered with its error object."""
    return path.startswith(API_PREFIX) or path in API_ROOT_PATHS


def api_or_page(status: int, page: Handler) -> Handler:
    """Django's handler of an error `status` (handler400 … handler500): the API's error
    object on the API's paths, Django's page elsewhere."""

    def handler(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_api_path(request.path_info):
            return page(request, *args, **kwargs)
        request_id = request_id_of(request)
        if status == 404:
            error = invalid_url(request)
        elif status >= 500:
            error = internal_error(request, request_id)
        else:
            error = ApiError(status, "The request was refused before it reached the API.")
        return finish(error.response(), request_id)

    return handler
