"""The Google credentials podrun calls Google's APIs with, found as gcloud finds them: an access token
file (CLOUDSDK_AUTH_ACCESS_TOKEN_FILE), else Application Default Credentials; and their own failures,
each as one line that says what to do."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import google.auth
import urllib3
from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
from google.oauth2.credentials import Credentials

from podrun.errors import PodrunError

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
METADATA_HOST = "metadata.google.internal"
METADATA_EMAIL = "/computeMetadata/v1/instance/service-accounts/default/email"
METADATA_TIMEOUT_S = 3.0


class GoogleCredentials:
    """google.auth's credentials, and what to say when Google will not take them."""

    def __init__(self, token_file: str | None):
        self.token_file = token_file  # None: Application Default Credentials
        self.credentials = _credentials(token_file)

    def service_account(self) -> str | None:
        """The service account of the credentials in use: a key file's, or on GCE the VM's, from the
        metadata server (asked only there, or where GCE_METADATA_HOST names one, as Google's libraries do)."""
        from google.auth import compute_engine  # it loads requests: ~20 ms that only this question pays

        email = getattr(self.credentials, "service_account_email", None)
        if email and email != "default":
            return email
        host = os.environ.get("GCE_METADATA_HOST")
        if not host and not isinstance(self.credentials, compute_engine.Credentials):
            return None
        try:
            answer = urllib3.request("GET", f"http://{host or METADATA_HOST}{METADATA_EMAIL}",
                                     headers={"Metadata-Flavor": "Google"}, timeout=METADATA_TIMEOUT_S, retries=False)
        except urllib3.exceptions.HTTPError:
            return None
        return (answer.data.decode().strip() or None) if answer.status == 200 else None

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """The credentials' own failures, whatever API was called, as one line each that says what to do."""
        try:
            yield
        except RefreshError as error:
            # a bare access token cannot be refreshed: google.auth tries when Google answers 401
            if self.token_file:
                raise PodrunError(f"{doing}: {self._token_rejected()}") from None
            raise PodrunError(f"{doing}: cannot refresh the Google credentials ({error}); run "
                              f"`gcloud auth application-default login`") from None
        except TransportError as error:  # refreshing the credentials, before the API is asked anything
            raise PodrunError(f"{doing}: cannot reach Google to refresh the credentials "
                              f"({type(error.__cause__ or error).__name__}); check the network") from None

    def rejected(self, message: str) -> str:
        """What to do when Google answered 401 (`message`) to these credentials."""
        if self.token_file:
            return self._token_rejected()
        return f"Google rejected the credentials ({message}); run `gcloud auth application-default login`"

    def _token_rejected(self) -> str:
        return (f"Google rejected the access token in {self.token_file} (CLOUDSDK_AUTH_ACCESS_TOKEN_FILE): it has "
                f"expired or is not valid; put a new one there, e.g. `gcloud auth print-access-token > "
                f"{self.token_file}`, or unset CLOUDSDK_AUTH_ACCESS_TOKEN_FILE to use Application Default "
                f"Credentials")


def _credentials(token_file: str | None):
    if token_file:
        try:
            return Credentials(Path(os.path.expanduser(token_file)).read_text().strip())
        except OSError as error:
            raise PodrunError(f"cannot read the access token file {token_file} (CLOUDSDK_AUTH_ACCESS_TOKEN_FILE): "
                              f"{error.strerror}") from None
    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except DefaultCredentialsError:
        raise PodrunError("no Google credentials found: run `gcloud auth application-default login` "
                          "(or point CLOUDSDK_AUTH_ACCESS_TOKEN_FILE at an access token)") from None
    return credentials
