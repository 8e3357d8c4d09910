"""Google's APIs failing, as podrun tells them apart: an error Google answered with (its HTTP status and
message), no connection, no answer in time; from google.auth's urllib3 transport or Google's generated client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import urllib3


class ApiCallError(Exception):
    """An error Google returned for a call: its HTTP status and message."""

    def __init__(self, code: int | None, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class ApiUnreachable(Exception):
    """The API could not be reached: the connection failed (the error's type name)."""


class ApiTimeout(Exception):
    """The API did not answer a request within the timeout."""


@contextlib.contextmanager
def client_errors() -> Iterator[None]:
    """The client's errors as ApiCallError, ApiUnreachable or ApiTimeout. Errors of calls arrive as
    HTTP classes (Conflict, ...): `code` is the HTTP status. The client's REST transport is requests."""
    import requests
    from google.api_core import exceptions

    try:
        yield
    except exceptions.GoogleAPICallError as error:
        raise ApiCallError(error.code, error.message or "") from None
    except requests.exceptions.Timeout:
        raise ApiTimeout() from None
    except requests.exceptions.RequestException as error:
        raise ApiUnreachable(type(error).__name__) from None


def error_of(response: urllib3.BaseHTTPResponse) -> ApiCallError:
    """The google.rpc.Status body Google answers errors with: {"error": {"code", "message", "status"}}."""
    try:
        message = json.loads(response.data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.data.decode(errors="replace").strip()[:200] or response.reason
    return ApiCallError(response.status, message)
