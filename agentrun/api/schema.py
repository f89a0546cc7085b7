"""The OpenAPI schema and its page, and drf-spectacular hooks."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.csp import CSP
from django.utils.decorators import method_decorator
from django.views.decorators.csp import csp_override
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from agentrun.api.http import ApiView


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """``Authorization: Bearer <key>`` as a scheme of its own (DRF's ``Token`` one keeps ``tokenAuth``).
    Registered when this module loads, which the preprocessing hook below makes happen first."""

    target_class = "agentrun.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"
    priority = 1  # before drf-spectacular's scheme for TokenAuthentication and its subclasses

    def get_security_definition(self, auto_schema: Any) -> dict:
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")


def drop_slash_aliases(endpoints: list[tuple], **kwargs: Any) -> list[tuple]:
    """Each route exists twice (with and without the trailing slash): document the contract's one."""
    seen: dict[tuple[str, str], tuple] = {}
    for endpoint in endpoints:
        path, _regex, method, _callback = endpoint
        key = (path.rstrip("/"), method)
        canonical = seen.get(key)
        # The contract spells collections of the root with a slash (/api/agents/) and the rest without.
        prefer_slash = path.rstrip("/") in {
            "/api/agents",
            "/api/schema",
            "/api/docs",
            "/api/webhook-endpoints",
            "/api/slack-destinations",
        }
        if canonical is None or (path.endswith("/") == prefer_slash):
            seen[key] = endpoint
    return list(seen.values())


class PublicDocs:
    """The schema and its page are public, yet a request presenting credentials is authenticated as on
    every endpoint (the same authenticators, Token first): a bad token gets the same 401, envelope and
    ``WWW-Authenticate`` challenge, not drf-spectacular's default 403. Errors are JSON, whatever the
    page's own format (YAML, HTML)."""

    authentication_classes = ApiView.authentication_classes

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(response, Response) and response.exception:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)


class SchemaView(PublicDocs, SpectacularAPIView):
    pass


# Swagger UI sets element styles from its script: the page allows inline styles (never inline script).
DOCS_CSP = {**settings.SECURE_CSP, "style-src": [CSP.SELF, CSP.UNSAFE_INLINE]}


@method_decorator(csp_override(DOCS_CSP), name="dispatch")
class SchemaPageView(PublicDocs, SpectacularSwaggerSplitView):
    """The split view serves its start-up script as a file (``?script``): no inline script, as the
    Content-Security-Policy requires."""
