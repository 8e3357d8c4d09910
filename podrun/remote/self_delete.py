"""A TPU VM deleting itself with its own credentials: the access token of the VM's service account from
the GCE metadata server, then a DELETE to the Cloud TPU API for each resource podrun would delete
(targets/tpu.py, self_delete_config: the node, or the queued resource that holds it, with force, as
podrun's own release asks). What worker 0 does when a job's supervisor is gone past its bound, or the
TPU had no job for `idle_delete` (idle_watch.py).

    delete({"api": "https://tpu.googleapis.com/", "names": ["projects/P/locations/Z/nodes/N"],
            "metadata_host": None})  ->  one line a person reads

The metadata server is `metadata_host` (HOST or HOST:PORT), else GCE_METADATA_HOST, as Google's
libraries read it, else metadata.google.internal. The VM's service account needs Cloud TPU Admin
(roles/tpu.admin: tpu.nodes.delete, tpu.queuedResources.delete); where it lacks it, Google answers 403
PERMISSION_DENIED and the line says so: the TPU stays, labelled, for `podrun list --orphans`.
Never raises on an HTTP or network failure. Standard library only, Python 3.8+, nothing done at import
(urllib loads only when a deletion is due: the agent carries this module on every start).
"""

import os

DEFAULT_METADATA_HOST = "metadata.google.internal"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
TIMEOUT_S = 30
ROLE = "roles/tpu.admin"
DENIED = "PERMISSION_DENIED: the VM's service account may not delete TPUs (it needs %s, Cloud TPU Admin)" % ROLE


def delete(config):
    """Ask the API to delete each of config["names"] with the VM's token; what came of it, in one line."""
    return attempt(config)[0]


def attempt(config):
    """delete()'s line, and how it went as a whole: "done" (each deletion under way, or gone already),
    "denied" (the service account lacks the permission for one), or "failed" (nothing was deleted:
    no token, no answer, another error; it may work a while later)."""
    names = config["names"]
    if not names:
        return "nothing to delete", "done"
    token, failure = access_token(config.get("metadata_host"))
    if token is None:
        return "cannot delete %s: %s" % (", ".join(map(_named, names)), failure), "failed"
    outcomes = [_delete_one(_api_base(config["api"]), name, token) for name in names]
    line = "; ".join(text for text, _ in outcomes)
    kinds = {kind for _, kind in outcomes}
    return line, "denied" if "denied" in kinds else "done" if kinds == {"done"} else "failed"


def denied(line):
    """Whether delete()'s line says the VM's service account lacks the permission."""
    return DENIED in line


def access_token(metadata_host=None):
    """(token, None) from the metadata server, or (None, why not)."""
    host = metadata_host or os.environ.get("GCE_METADATA_HOST") or DEFAULT_METADATA_HOST
    status, body = _request("GET", "http://%s%s" % (host, TOKEN_PATH), {"Metadata-Flavor": "Google"}, proxied=False)
    if status is None:
        return None, "no access token: the metadata server at %s cannot be reached (%s)" % (host, body)
    if status != 200:
        return None, "no access token: the metadata server at %s answered %d (%s)" % (host, status, _short(body))
    try:
        import json

        return json.loads(body)["access_token"], None
    except (ValueError, KeyError, TypeError):
        return None, "no access token: the metadata server at %s answered %s" % (host, _short(body))


def _delete_one(base, name, token):
    queued = "/queuedResources/" in name
    url = "%s/v2/%s%s" % (base, name, "?force=true" if queued else "")
    status, body = _request("DELETE", url, {"Authorization": "Bearer " + token})
    what = _named(name)
    if status is None:
        return "cannot delete %s: the Cloud TPU API at %s cannot be reached (%s)" % (what, base, body), "failed"
    if 200 <= status < 300:
        return "deleting %s: the Cloud TPU API accepted the request" % what, "done"
    code, message = _google_error(status, body)
    if code == "NOT_FOUND":
        return "%s is gone already" % what, "done"
    if code == "PERMISSION_DENIED" and "has not been used" not in message and "is disabled" not in message:
        return "cannot delete %s: %s: %s" % (what, DENIED, message), "denied"
    return "cannot delete %s: the Cloud TPU API answered %d %s: %s" % (what, status, code, message), "failed"


def _named(name):
    """`projects/P/locations/Z/nodes/N` -> `TPU VM N in P/Z` (a queued resource: `queued resource Q ...`)."""
    parts = name.split("/")
    if len(parts) != 6:
        return name
    kind = "queued resource" if parts[4] == "queuedResources" else "TPU VM"
    return "%s %s in %s/%s" % (kind, parts[5], parts[1], parts[3])


def _api_base(api):
    """The API's base URL as the launcher's TpuApi uses it: no trailing `/` or `/v2`, https:// unless given."""
    base = api.rstrip("/")
    if base.endswith("/v2"):
        base = base[:-3]
    return base if "://" in base else "https://" + base


def _google_error(status, body):
    """(status word, message) of Google's error body (google.rpc.Status), else the HTTP status and the text."""
    try:
        import json

        error = json.loads(body)["error"]
        return str(error.get("status") or error.get("code")), str(error.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return str(status), _short(body)


def _request(method, url, headers, proxied=True):
    """(HTTP status, body text), or (None, why) where no answer came. The metadata server is asked
    directly (`proxied` False), never through an HTTP proxy the environment names: the token is the VM's."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, headers=headers)
    opener = urllib.request.build_opener(*([] if proxied else [urllib.request.ProxyHandler({})]))
    try:
        with opener.open(request, timeout=TIMEOUT_S) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        try:
            text = error.read().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 -- a body that breaks off: the status is the news
            text = ""
        return error.code, text
    except Exception as error:  # noqa: BLE001 -- URLError, a timeout, a reset, a bad URL: never raised
        return None, str(getattr(error, "reason", None) or error)


def _short(text, limit=200):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."
