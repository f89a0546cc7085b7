"""``Authorization: Bearer <key>``, beside DRF's ``Token <key>`` (docs/api.md#authentication-and-permissions).

The same API tokens, spelt the way OpenAI, Azure and Mastra clients send them. A module of its own:
``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]`` names it, and DRF imports those while it is still
importing its views, so this must not import them back.
"""

from __future__ import annotations

from rest_framework.authentication import TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"
