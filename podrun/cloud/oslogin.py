"""OS Login, as gcloud's `tpu-vm ssh` does it (googlecloudsdk command_lib/util/ssh/ssh.py,
GetOsloginState; api_lib/oslogin/client.py).

OS Login governs a TPU VM when `enable-oslogin` is TRUE in its metadata, or, where its metadata does
not say, in its project's (Compute Engine's `projects.get`, `commonInstanceMetadata`). Its guest then
takes keys only from the Cloud OS Login API, for the account's POSIX user, and ignores `ssh-keys`. So
podrun reads the account's login profile (`GET v1/users/EMAIL/loginProfile?projectId=P`), imports its
key there when the profile lacks it or has no POSIX account in the project
(`POST v1/users/EMAIL:importSshPublicKey?projectId=P`), and logs in as the primary POSIX account's
user name; it writes no `ssh-keys`. The endpoints are gcloud's overrides where set
(CLOUDSDK_API_ENDPOINT_OVERRIDES_OSLOGIN, ..._COMPUTE); the requests go through the TPU API's
credentials and transport (cloud/tpu_api.py).

The account is gcloud's: CLOUDSDK_CORE_ACCOUNT, else the active configuration's `core/account`, else
the service account of the credentials in use (on GCE, the metadata server's
`instance/service-accounts/default/email`; GCE_METADATA_HOST names the server, as in Google's
libraries). 2-step verification (`enable-oslogin-2fa`) and security keys (`enable-oslogin-sk`) need a
person or a hardware key at each login, which podrun cannot give: each is refused in one line.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from urllib.parse import quote

from podrun.cloud.api_errors import ApiCallError, ApiTimeout, ApiUnreachable
from podrun.cloud.settings import ACCOUNT, COMPUTE_ENDPOINT, OSLOGIN_ENDPOINT, config_dir, gcloud_property
from podrun.cloud.tpu_api import TpuApi
from podrun.errors import PodrunError

ENABLE = "enable-oslogin"
TWO_FACTOR = "enable-oslogin-2fa"
SECURITY_KEYS = "enable-oslogin-sk"
GOOGLE_OSLOGIN = "https://oslogin.googleapis.com/"
GOOGLE_COMPUTE = "https://compute.googleapis.com/compute/v1/"
LOGIN_ROLE = "roles/compute.osLogin"


@dataclass(frozen=True)
class Login:
    """Who podrun is under OS Login: the account, its POSIX user name, in which project."""

    account: str
    user: str
    project: str

    def refused_advice(self) -> str:
        """Why a worker refuses the key the API took (the guest asks whether the account may log in)."""
        kind = "serviceAccount" if self.account.endswith(".gserviceaccount.com") else "user"
        return (f"OS Login took the key of {self.account}, so most likely the account lacks {LOGIN_ROLE} (or "
                f"roles/compute.osAdminLogin) in project {self.project}: `gcloud projects add-iam-policy-binding "
                f"{self.project} --member={kind}:{self.account} --role={LOGIN_ROLE}`")


class OsLogin:
    """OS Login for the nodes of one project: whether it governs each, and the login (made once)."""

    def __init__(self, api: TpuApi):
        self.api = api
        self.project = api.location.project
        self._project_metadata: dict[str, str] | None = None
        self._login: Login | None = None
        self._lock = threading.Lock()  # the slices of a multislice are reached at once

    def governs(self, node_metadata: dict[str, str] | None) -> bool:
        """Whether OS Login governs a node of this metadata (None: a node not made yet)."""
        return self._enabled(ENABLE, node_metadata or {})

    def login(self, node_metadata: dict[str, str], public_key: str) -> Login:
        """The account's POSIX user, with `public_key` ("ssh-ed25519 AAAA... comment") in its profile."""
        for key, needs in ((TWO_FACTOR, "2-step verification"), (SECURITY_KEYS, "a security key")):
            if self._enabled(key, node_metadata):
                where = "TPU VM's" if key in node_metadata else f"project {self.project}'s"
                raise PodrunError(
                    f"OS Login here requires {needs} at each login ({key} in the {where} metadata), which podrun "
                    f"cannot give; log in with `gcloud compute tpus tpu-vm ssh NAME --worker=all "
                    f"{self.api.location.flags}`, or set {key}=FALSE in the TPU VM's metadata")
        with self._lock:
            if self._login is None:
                self._login = self._import(public_key)
            return self._login

    def _enabled(self, key: str, node_metadata: dict[str, str]) -> bool:
        """The node's value of `key`, else the project's: TRUE or not (gcloud's FeatureEnabledInMetadata)."""
        value = node_metadata[key] if key in node_metadata else self._project().get(key, "")
        return value.lower() == "true"

    def _project(self) -> dict[str, str]:
        with self._lock:
            if self._project_metadata is None:
                url = f"{_base(COMPUTE_ENDPOINT, GOOGLE_COMPUTE)}projects/{self.project}"
                answer = self._call("reading the metadata of project", "Compute Engine", "GET", url)
                items = answer.get("commonInstanceMetadata", {}).get("items", [])
                self._project_metadata = {item["key"]: item.get("value", "") for item in items}
            return self._project_metadata

    def _import(self, public_key: str) -> Login:
        email = account(self.api)
        base = f"{_base(OSLOGIN_ENDPOINT, GOOGLE_OSLOGIN)}v1/users/{quote(email, safe='@')}"
        project = f"projectId={quote(self.project)}"
        profile = self._call(f"reading the OS Login profile of {email} in", "OS Login", "GET",
                             f"{base}/loginProfile?{project}")
        blob = public_key.split()[1]
        has_key = any(blob in key.get("key", "") for key in profile.get("sshPublicKeys", {}).values())
        if not has_key or not profile.get("posixAccounts"):
            profile = self._call(f"importing the SSH key of {email} into OS Login for", "OS Login", "POST",
                                 f"{base}:importSshPublicKey?{project}", {"key": public_key}).get("loginProfile", {})
        accounts = profile.get("posixAccounts", [])
        chosen = next((each for each in accounts if each.get("primary")), accounts[0] if accounts else None)
        if chosen is None:
            raise PodrunError(f"OS Login gave {email} no POSIX account in project {self.project}; "
                              f"`gcloud compute os-login describe-profile --project {self.project}` shows its profile")
        return Login(email, chosen["username"], self.project)

    def _call(self, doing: str, service: str, method: str, url: str, body: dict | None = None) -> dict:
        doing = f"{doing} {self.project}"
        try:
            with self.api.auth.errors(doing):
                return self.api.call(method, url, body)
        except ApiCallError as error:
            raise PodrunError(f"{doing}: {self._advice(error, service)}") from None
        except ApiUnreachable as error:
            raise PodrunError(f"{doing}: cannot reach the {service} API at {url.split('/v1')[0]} ({error})") from None
        except ApiTimeout:
            raise PodrunError(f"{doing}: no answer from the {service} API after {self.api.timeout_s:g}s; check "
                              f"your network (PODRUN_API_TIMEOUT sets the seconds to wait)") from None

    def _advice(self, error: ApiCallError, service: str) -> str:
        if error.code == 401:
            return self.api.auth.rejected(error.message)
        if error.code == 403:
            api = "oslogin.googleapis.com" if service == "OS Login" else "compute.googleapis.com"
            return (f"permission denied ({error.message}); the {service} API must be enabled in the project "
                    f"(`gcloud services enable {api} --project {self.project}`) and usable by your account")
        return f"{service} API error {error.code}: {error.message}"


def account(api: TpuApi) -> str:
    """The Google account podrun acts as, as gcloud finds it (see the module's docstring)."""
    if email := gcloud_property(ACCOUNT) or api.auth.service_account():
        return email
    raise PodrunError(f"OS Login needs your Google account, and none was found: not in CLOUDSDK_CORE_ACCOUNT, "
                      f"not as core/account in the active gcloud configuration (in {config_dir()}), and the "
                      f"credentials in use are no service account's; run `gcloud config set account EMAIL` "
                      f"or export CLOUDSDK_CORE_ACCOUNT=EMAIL")


def _base(setting: tuple[str, str], google: str) -> str:
    """An API's root URL, ending in `/`: gcloud's endpoint override where set, else Google's."""
    base = gcloud_property(setting) or google
    return base if base.endswith("/") else base + "/"
