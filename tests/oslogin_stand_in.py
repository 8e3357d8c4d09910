"""A stand-in for Cloud OS Login: the API v1 that gcloud and podrun call
(https://cloud.google.com/compute/docs/oslogin/rest), and what a VM's guest asks the metadata server
about OS Login users, as the guest agent's `google_authorized_keys` does. Served on the lab's bridge,
which this machine and every lab host reach.

The API, with a bearer token that names its account (`add_account(..., token=)`):
  GET    /v1/users/EMAIL/loginProfile?projectId=P               the LoginProfile
  POST   /v1/users/EMAIL:importSshPublicKey?projectId=P  {key}   {loginProfile}: with projectId, the
         account's POSIX account in P is made on the first import, as Google makes it
  DELETE /v1/users/EMAIL/sshPublicKeys/FINGERPRINT
As on Google, a token acts on its own account only (else 403 PERMISSION_DENIED), any other token is
401 UNAUTHENTICATED, errors are google.rpc.Status bodies, and importing works whatever roles the
account holds: a missing login role shows only when sshd refuses the key.

The guest's side (header `Metadata-Flavor: Google`, else 403):
  GET /computeMetadata/v1/oslogin/users?username=NAME    {"loginProfiles": [profile, name = email]}; 404
  GET /computeMetadata/v1/oslogin/authorize?email=E&policy=login    {"success": whether the account
      holds roles/compute.osLogin or roles/compute.osAdminLogin}
`authorized_keys_command()` writes the program a lab sshd runs (AuthorizedKeysCommand) to take keys
from here and nowhere else.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import SplitResult, parse_qs, unquote

from tpu_stand_in import INVALID_CREDENTIALS, ApiError, JsonHandler, error_body, send_json

GUEST_PREFIX = "/computeMetadata/v1/oslogin/"
FIRST_UID = 3_100_000  # OS Login's uids are large numbers, clear of the machine's own users
# what sshd runs as AuthorizedKeysCommand: the keys of the OS Login user %u, if the account may log in
AUTHORIZED_KEYS_PROGRAM = """\
#!/usr/bin/python3 -I
import json, sys, urllib.error, urllib.parse, urllib.request
BASE = {base!r}

def ask(query):
    request = urllib.request.Request(BASE + query, headers={{"Metadata-Flavor": "Google"}})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)
    except urllib.error.HTTPError:
        return None

users = ask("users?username=" + urllib.parse.quote(sys.argv[1]))
if not users:
    sys.exit(0)
profile = users["loginProfiles"][0]
allowed = ask("authorize?email=" + urllib.parse.quote(profile["name"]) + "&policy=login")
if allowed and allowed.get("success"):
    for key in profile.get("sshPublicKeys", {{}}).values():
        print(key["key"].strip())
"""


@dataclass
class Account:
    """A Google account as OS Login knows it."""

    email: str
    id: str  # its unique numeric id
    uid: int
    login_role: bool  # roles/compute.osLogin or roles/compute.osAdminLogin in the project
    projects: set[str] = field(default_factory=set)  # those where it has a POSIX account (made on import)
    keys: dict[str, dict] = field(default_factory=dict)  # by fingerprint

    @property
    def username(self) -> str:
        """Its POSIX user name, as OS Login makes it: `alice_example_com`; a service account's `sa_<id>`."""
        if self.email.endswith(".gserviceaccount.com"):
            return f"sa_{self.id}"
        return re.sub(r"[^a-z0-9_]", "_", self.email.lower())[:32]

    def profile(self, project: str | None, name: str) -> dict:
        """Its LoginProfile: `name` as the caller sees it, the POSIX account of `project` if it has one."""
        answer: dict = {"name": name}
        if project in self.projects:
            answer["posixAccounts"] = [{
                "primary": True, "username": self.username, "uid": str(self.uid), "gid": str(self.uid),
                "homeDirectory": f"/home/{self.username}", "shell": "/bin/bash", "gecos": "", "systemId": "",
                "accountId": project, "operatingSystemType": "LINUX",
                "name": f"users/{self.email}/projects/{project}"}]
        if self.keys:
            answer["sshPublicKeys"] = self.keys
        return answer


class OsLoginStandIn:
    def __init__(self):
        self.accounts: dict[str, Account] = {}  # by email
        self.tokens: dict[str, str] = {}  # bearer token -> email
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, query) of the API's requests
        self.lock = threading.Lock()
        self.ids = itertools.count()
        self.server: ThreadingHTTPServer | None = None
        self.url = ""

    def add_account(self, email: str, token: str, login_role: bool = True) -> Account:
        number = next(self.ids)
        account = Account(email, str(104_857_600_000_000_000_000 + number), FIRST_UID + number, login_role)
        self.accounts[email] = account
        self.tokens[token] = email
        return account

    def imports(self) -> list[str]:
        """The emails of the importSshPublicKey calls received, in order."""
        with self.lock:
            return [unquote(path).split("/")[3].removesuffix(":importSshPublicKey")
                    for method, path, _ in self.requests if path.endswith(":importSshPublicKey")]

    def serve(self, address: str) -> str:
        stand_in = self

        class Handler(JsonHandler):
            def answer(self, method: str, url: SplitResult, body: dict) -> None:
                query = {key: values[0] for key, values in parse_qs(url.query).items()}
                try:
                    with stand_in.lock:
                        if url.path.startswith(GUEST_PREFIX):
                            if self.headers.get("Metadata-Flavor") != "Google":
                                raise ApiError("PERMISSION_DENIED", "Missing required header: Metadata-Flavor")
                            answer = stand_in.guest(url.path.removeprefix(GUEST_PREFIX), query)
                        else:
                            stand_in.requests.append((method, url.path, query))
                            caller = stand_in.caller(self.headers.get("Authorization", ""))
                            answer = stand_in.handle(method, unquote(url.path), query, body, caller)
                    status = 200
                except ApiError as error:
                    status, answer = error_body(error)
                send_json(self, status, answer)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{address}:{self.server.server_address[1]}"
        return self.url

    def shutdown(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def authorized_keys_command(self, directory: Path) -> Path:
        """The guest's google_authorized_keys for a lab sshd, asking this stand-in: written in
        `directory`, which sshd requires (with each directory above it) to be root's and writable by no one else."""
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        program = directory / "google_authorized_keys"
        program.write_text(AUTHORIZED_KEYS_PROGRAM.format(base=self.url + GUEST_PREFIX))
        program.chmod(0o755)
        return program

    # --- the API -------------------------------------------------------------------------------
    def caller(self, authorization: str) -> Account:
        if not authorization.startswith("Bearer "):
            raise ApiError("UNAUTHENTICATED", "Request is missing required authentication credential.")
        email = self.tokens.get(authorization.removeprefix("Bearer ").strip())
        if email is None:
            raise ApiError("UNAUTHENTICATED", INVALID_CREDENTIALS)
        return self.accounts[email]

    def handle(self, method: str, path: str, query: dict, body: dict, caller: Account) -> dict:
        match = re.fullmatch(r"/v1/users/([^/:]+)(/loginProfile|:importSshPublicKey|/sshPublicKeys/([0-9a-f]+))", path)
        if not match:
            raise ApiError("NOT_FOUND", f"The requested URL {path} was not found on this server.")
        email, call, fingerprint = match.groups()
        if email != caller.email:
            raise ApiError("PERMISSION_DENIED", "The caller does not have permission")
        project = query.get("projectId")
        if call == "/loginProfile" and method == "GET":
            return caller.profile(project, caller.id)
        if call == ":importSshPublicKey" and method == "POST":
            return self._import(caller, project, body)
        if fingerprint and method == "DELETE":
            if caller.keys.pop(fingerprint, None) is None:
                raise ApiError("NOT_FOUND", f"Resource 'users/{email}/sshPublicKeys/{fingerprint}' was not found")
            return {}
        raise ApiError("NOT_FOUND", f"{method} {path} not found")

    def _import(self, account: Account, project: str | None, body: dict) -> dict:
        words = str(body.get("key", "")).split()
        if len(words) < 2 or not re.fullmatch(r"(ssh-|ecdsa-|sk-)\S+", words[0]):
            raise ApiError("INVALID_ARGUMENT", "Invalid SSH public key.")
        fingerprint = hashlib.sha256(" ".join(words[:2]).encode()).hexdigest()
        account.keys[fingerprint] = {"key": body["key"], "fingerprint": fingerprint,
                                     "name": f"users/{account.email}/sshPublicKeys/{fingerprint}",
                                     **({"expirationTimeUsec": body["expirationTimeUsec"]}
                                        if body.get("expirationTimeUsec") else {})}
        if project:
            account.projects.add(project)
        return {"loginProfile": account.profile(project, account.id)}

    # --- the guest's side ------------------------------------------------------------------------
    def guest(self, call: str, query: dict) -> dict:
        if call == "users" and "username" in query:
            account = next((a for a in self.accounts.values() if a.username == query["username"] and a.projects), None)
            if account is None:
                raise ApiError("NOT_FOUND", "Not Found")
            return {"loginProfiles": [account.profile(next(iter(account.projects)), account.email)]}
        if call == "authorize" and query.get("policy") == "login":
            account = self.accounts.get(query.get("email", ""))
            return {"success": bool(account and account.login_role)}
        raise ApiError("NOT_FOUND", "Not Found")
