"""A notification as it goes out (remote/notice.py): the message Slack and Discord show, the URL's host as
the only part of it ever said, and delivery's tries against a webhook stand-in on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from podrun.remote import notice

from helpers import REPO, section


def test_the_text_is_one_line_with_slacks_markup_escaped_and_discords_content_pings_no_one():
    body = notice.message("j-1", "train", "failed", "failure", 2, 1200, "RuntimeError: <!channel> & @everyone\nmore")
    assert body["reason"] == "RuntimeError: <!channel> & @everyone more"
    assert body["content"] == ("podrun: job train failed (attempt 2, step 1200): RuntimeError: <!channel> & @everyone "
                               "more [j-1]")
    assert body["text"] == ("podrun: job train failed (attempt 2, step 1200): RuntimeError: &lt;!channel&gt; &amp; "
                            "@everyone more [j-1]")
    assert body["allowed_mentions"] == {"parse": []}
    assert len(notice.message("j", "n", "failed", "failure", 0, None, "x" * 5000)["reason"]) == notice.REASON_CHARS


def test_only_the_urls_host_is_ever_said():
    assert notice.host_of("https://hooks.slack.com/services/T0/B0/token?x=1") == "hooks.slack.com"
    assert notice.host_of("http://user:secret@10.0.0.1:8080/hook") == "10.0.0.1:8080"
    assert notice.host_of("https://discord.com") == "discord.com"


def test_a_refusal_that_would_be_answered_the_same_is_not_tried_again_and_a_busy_webhook_is(webhook):
    body = notice.message("j", "n", "succeeded", "success", 0, None, "")
    waits: list[float] = []
    stand_in, url = webhook()
    assert notice.deliver(url + "-wrong", body, sleep=waits.append) == {"delivered": False, "tries": 1,
                                                                        "error": "HTTP 404"}
    assert notice.deliver(url, body, sleep=waits.append) == {"delivered": True, "tries": 1}
    stand_in.status = 429
    assert notice.deliver(url, body, sleep=waits.append) == {"delivered": False, "tries": 3, "error": "HTTP 429"}
    assert waits == list(notice.BACKOFF_S) and stand_in.requests == 5
    refused = notice.deliver(url.replace(url.split("/")[2], "127.0.0.1:9"), body, sleep=waits.append)
    assert refused["delivered"] is False and refused["tries"] == 3 and "refused" in refused["error"].lower()
    assert notice.BOUND_S == notice.TRIES * notice.TIMEOUT_S + sum(notice.BACKOFF_S) <= 10


@pytest.mark.parametrize("page, heading", [("README.md", "## Long runs: progress, stalls, goodput, cost, notifications"),
                                           ("docs/notifications.md", "## The message")])
def test_the_json_the_docs_show_is_what_podrun_sends(page, heading):
    shown = json.loads(section((REPO / page).read_text(), heading).split("```json\n")[1].split("```")[0])
    fields = [shown[name] for name in ("job", "name", "state", "event", "attempt", "step", "reason", "cause")]
    assert notice.message(*fields) == shown


def test_the_docs_give_the_bounds_the_code_keeps():
    from podrun.notify import DRAIN_S

    delivery = section((REPO / "docs/notifications.md").read_text(), "## Delivery")
    assert f"gives up within {notice.BOUND_S:g} s" in delivery
    assert f"**{DRAIN_S:g} s at most**" in delivery
    assert f"at most {notice.TRIES} times, with a {notice.TIMEOUT_S:g} s timeout" in delivery


def test_worker_0_tells_a_stop_a_preemption_a_lost_worker_and_a_stall_apart():
    """agent.job_end, as worker 0's agent of a detached job that nothing watches decides what it tells once
    every agent is done, from its hub's words (what each agent said with its exit) and its own step."""
    from types import SimpleNamespace

    from podrun.remote import agent, hub

    def ended(own_code=0, own_reason=None, said=None, failure=None, stalled=False):
        watch = hub.Hub({"token": "t", "worker": 0, "workers": 3, "bind": "127.0.0.1"}, "/nonexistent")
        watch.listener.close()
        watch.ended, watch.words, watch.failure, watch.stalled, watch.stall = {0, 1, 2}, said or {}, failure, stalled, 60
        return agent.job_end(0, SimpleNamespace(stop_reason=own_reason, stalled=None, steps=None), watch, own_code)

    assert ended() == ("success", "succeeded", "every worker exited with code 0")
    assert ended(143, "worker 1 failed with code 143", {1: "stopped"}, (1, 143)) is None  # podrun stop: others first
    assert ended(143, "SIGTERM") is None
    assert ended(143, "worker 2 failed with code 143", {2: "preempted"}, (2, 143)) == (
        "preemption", "preempted", "worker 2: the VM announced it goes away")
    assert ended(143, "worker 1 failed with code 255", {}, (1, hub.LOST)) == (
        "failure", "failed", "worker 1 was lost (its agent, its host or the link to it)")
    assert ended(143, "stalled: silent for 60.0s", {}, None, stalled=True) == (
        "stall", "stalled", "no output from any worker for 60s")
    assert agent.job_end(0, SimpleNamespace(stop_reason=None, stalled=None, steps=None), None, 7) == (
        "failure", "failed", "worker 0 exited with code 7")
