"""A job's notification (the spec's `notify`) as it goes out: the JSON message a person's webhook gets,
and its delivery, one HTTP POST tried a few times. The launcher's side is podrun/notify.py; worker 0's
agent of a detached job that nothing watches sends the job's end itself (agent.py, tell_end). Standard
library only, Python 3.8+, nothing done at import: json, urllib and threading are imported only when a
message goes out.

The message holds `text`, the line Slack's incoming webhooks show (their markup, `&`, `<` and `>`,
escaped as Slack asks), `content`, the same line as Discord's webhooks read it, and Discord's
`allowed_mentions` with nothing allowed: a worker's output quoted in a reason pings no one.

Delivery: at most TRIES tries, each with a socket timeout of TIMEOUT_S, BACKOFF_S apart; an answer
other than 2xx is tried again, except a 4xx other than 408 and 429, which would be answered the same.
So a message gives up within BOUND_S (a name lookup that hangs aside, which deliver_within bounds).
The URL is a secret (a webhook's token is in it): only its host is ever said or recorded (host_of).
"""

import time

TRIES = 3
TIMEOUT_S = 2.0
BACKOFF_S = (0.5, 1.5)  # before the second try, and before the third
BOUND_S = TRIES * TIMEOUT_S + sum(BACKOFF_S)
REASON_CHARS = 300  # a reason is one line, cut to this
LINE_CHARS = 2000  # what Discord takes of `content`
ALL_DONE = "every worker exited with code 0"  # a success's reason
VERBS = {"failure": "failed", "preemption": "was preempted", "stall": "stalled", "restart": "restarts",
         "success": "succeeded", "straggler": "has a straggler"}


def message(job, name, state, event, attempt, step, reason, cause=None):
    """The JSON object POSTed for `event` of job `job` (its id) called `name`; `cause`: a failure's, as the
    record keeps it (launch/causes.py), with `said` (`oom on worker 2`), which its line names."""
    reason = " ".join(str(reason or "").split())[:REASON_CHARS]
    where = "attempt %d" % attempt + ("" if step is None else ", step %d" % step) + (", " + cause["said"] if cause else "")
    line = ("podrun: job %s %s (%s)%s [%s]" % (name, VERBS[event], where, ": " + reason if reason else "", job))[:LINE_CHARS]
    slack_line = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return {"job": job, "name": name, "state": state, "event": event, "attempt": attempt, "step": step,
            "reason": reason, "cause": cause, "text": slack_line, "content": line, "allowed_mentions": {"parse": []}}


def deliver(url, body, sleep=time.sleep, tried=None):
    """POST `body` (a message) to `url`, tried as the module's docstring says: {"delivered", "tries",
    "error" (what the last try got, never the URL)}; `tried(tries, error)` is told of each failed try."""
    import json
    import socket
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode()
    error = None
    for tries in range(1, TRIES + 1):
        request = urllib.request.Request(url, data, {"Content-Type": "application/json",
                                                     "User-Agent": "podrun"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310 (http or https only: spec/model.py)
                answer.read(65536)
            return {"delivered": True, "tries": tries}
        except urllib.error.HTTPError as refused:
            error = "HTTP %d" % refused.code
            if 400 <= refused.code < 500 and refused.code not in (408, 429):
                break
        except (socket.timeout, TimeoutError):
            error = "no answer within %gs" % TIMEOUT_S
        except urllib.error.URLError as failed:
            timed_out = isinstance(failed.reason, (socket.timeout, TimeoutError))
            error = "no answer within %gs" % TIMEOUT_S if timed_out else _said(failed.reason)
        except (OSError, ValueError) as failed:  # a connection reset mid-answer, a malformed answer
            error = _said(failed)
        if tried:
            tried(tries, error)
        if tries < TRIES:
            sleep(BACKOFF_S[tries - 1])
    return {"delivered": False, "tries": tries, "error": error}


def deliver_within(url, body, bound_s):
    """deliver(), given up after `bound_s` (a name lookup, which no timeout covers, may hang)."""
    import threading

    outcome = {}
    sender = threading.Thread(target=lambda: outcome.update(deliver(url, body)), daemon=True)
    sender.start()
    sender.join(bound_s)
    return outcome or {"delivered": False, "tries": 0, "error": "not delivered within %gs" % bound_s}


def entry(body, outcome, url, by):
    """What a job's record keeps of a notification (JobRecord.events): the event, its attempt, when, whether
    it was delivered and in how many tries (the error if not), the URL's host, and who sent it."""
    return dict({"event": body["event"], "attempt": body["attempt"], "at": round(time.time(), 3),
                 "to": host_of(url), "by": by}, **outcome)


def host_of(url):
    """The URL's host, which is all of it that is ever said: the rest may hold the webhook's token."""
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]


def _said(reason):
    """An error's words, without any URL (urllib's never hold one, but a reason is what others wrote)."""
    text = str(getattr(reason, "strerror", None) or reason)
    return " ".join(word for word in text.split() if "://" not in word)[:200]
