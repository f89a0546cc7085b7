import pytest


@pytest.fixture(autouse=True)
def _no_embedded_sweeper(settings):
    # The ASGI app would start a sweeper on each test's event loop; tests sweep explicitly instead.
    settings.AGENTRUN_EMBEDDED_SWEEPER = False
