"""``ws/approvals/``: readers get an htmx fragment per change; anonymous sockets are refused."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agentrun.asgi import application
from agentrun.core.access import VIEWERS
from tests.helpers.runs import EMAIL, suspended_email_run
from tests.helpers.users import make_user, token_of

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = [(b"origin", b"http://localhost")]


@sync_to_async
def viewer_token() -> str:
    return token_of(make_user("vic", group=VIEWERS, password="pw-12345678"))


async def frame_about(comm: WebsocketCommunicator, run_id: str, event: str | None = None) -> str:
    """The next frame about ``run_id`` (and ``event``, if given): the feed carries every run's events, and
    one of a run an earlier test left may still be on its way — or this run's suspension, when the
    socket connected while it was being told."""
    wanted = [f'data-run-id="{run_id}"', *([f'data-event="{event}"'] if event else [])]
    while True:
        frame = await comm.receive_from(timeout=5)
        if all(part in frame for part in wanted):
            return frame


async def test_anonymous_socket_is_refused():
    comm = WebsocketCommunicator(application, "/ws/approvals/", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert not connected


async def test_a_suspension_reaches_the_feed_as_an_oob_fragment():
    token = await viewer_token()
    comm = WebsocketCommunicator(application, f"/ws/approvals/?token={token}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected
    run_id = await suspended_email_run(thread="t-feed", args=dict(EMAIL, subject="<b>hi</b>"))
    frame = await frame_about(comm, run_id)
    assert frame.startswith('<div id="live-status" hx-swap-oob="true"')
    assert 'data-event="suspended"' in frame and f'data-run-id="{run_id}"' in frame
    assert 'data-thread-id="t-feed"' in frame and "<b>" not in frame
    await comm.disconnect()


async def test_a_thread_id_of_any_characters_reaches_the_feed_intact():
    token = await viewer_token()
    comm = WebsocketCommunicator(application, f"/ws/approvals/?token={token}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected
    odd = 'a/../b c%?#"<i>ü' + "x" * 200  # any printable character (control ones are refused in ids)
    run_id = await suspended_email_run(thread=odd)
    frame = await frame_about(comm, run_id)
    assert 'data-thread-id="a/../b c%?#&quot;&lt;i&gt;ü' + "x" * 200 + '"' in frame
    await comm.disconnect()


async def test_a_claim_reaches_the_feed_with_who_is_on_it():
    """docs/dashboard.md#shared-work: a claim is news for every open page (escaped like everything)."""
    from django.contrib.auth.models import Group, User

    from agentrun.core import claims
    from agentrun.core.access import REVIEWERS
    from agentrun.core.models import SuspendedToolCall

    token = await viewer_token()
    run_id = await suspended_email_run(thread="t-feed-claim")
    comm = WebsocketCommunicator(application, f"/ws/approvals/?token={token}", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected

    @sync_to_async
    def claim() -> None:
        user = User.objects.create_user('ada"<b>', password="pw-12345678")
        user.groups.add(Group.objects.get(name=REVIEWERS))
        claims.claim(user=user, call=SuspendedToolCall.objects.select_related("run").get(run_id=run_id))

    await claim()
    frame = await frame_about(comm, run_id, "claimed")
    assert 'data-claimed-by="ada&quot;&lt;b&gt;"' in frame
    await comm.disconnect()
