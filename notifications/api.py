"""REST for webhook endpoints (docs/notifications.md#25-rest) and Slack destinations (docs/api.md#slack-destinations):
superusers, and staff holding the model permission.

``GET/POST /api/webhook-endpoints/``, ``GET/PATCH/DELETE /api/webhook-endpoints/{id}``,
``GET /api/webhook-endpoints/{id}/deliveries``. ``secret`` is write-only: a POST without one gets a
generated ``whsec_`` secret, shown in that response only. The URL must reach a public address
(``notifications.egress``); whoever creates or changes an endpoint becomes its owner, and it receives
only the events of agents they may view.

``GET/POST /api/slack-destinations/``, ``GET/PATCH/DELETE /api/slack-destinations/{id}``,
``GET /api/slack-destinations/{id}/deliveries``: the same rules; ``botToken`` is write-only (required on
creation), and unknown keys are refused (``details.unknownFields``).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentrun.api.http import ApiView, check_text
from agentrun.api.pagination import cursor_page
from agentrun.api.serializers import ErrorSerializer, list_of
from agentrun.api.views import CURSOR_PARAMS
from agentrun.core.errors import AgentRunError
from agentrun.core.outbox import EVENT_TYPES
from notifications import egress, signatures
from notifications.models import SlackDelivery, SlackDestination, WebhookDelivery, WebhookEndpoint

JSON = "application/json"
ACTIONS = {"GET": "view", "POST": "add", "PATCH": "change", "DELETE": "delete"}


class StaffWithModelPermission(BasePermission):
    """Superusers, and staff holding ``notifications.<action>_<model>`` for the request's method."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if user.is_superuser:
            return True
        perm = f"notifications.{ACTIONS.get(request.method, 'change')}_{view.model_name}"
        return user.is_staff and user.has_perm(perm)


def _errors(*statuses: int) -> dict:
    return {status: OpenApiResponse(ErrorSerializer, description="Error envelope") for status in statuses}


# --- shapes -------------------------------------------------------------------------------------
class EndpointInputSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=2000, help_text="http(s) URL the events are POSTed to.")
    secret = serializers.CharField(
        max_length=255,
        required=False,
        trim_whitespace=False,
        help_text="Write-only. HMAC key: a whsec_<base64> secret is its decoded bytes, any other its UTF-8 "
        "bytes. Omitted on creation: one is generated and returned in that response only.",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EVENT_TYPES), required=False, help_text="Empty or omitted: all."
    )
    agents = serializers.ListField(
        child=serializers.CharField(max_length=128), required=False, help_text="Agent ids; empty or omitted: all."
    )
    active = serializers.BooleanField(required=False)
    format = serializers.ChoiceField(
        choices=WebhookEndpoint.Format.choices, required=False, help_text="slack: a Slack incoming-webhook message."
    )

    def validate_url(self, value: str) -> str:
        for validator in WebhookEndpoint._meta.get_field("url").validators:  # http(s) URLs only
            validator(value)
        if problem := egress.url_problem(value):  # loopback, private, link-local, … (docs/security.md)
            raise serializers.ValidationError(problem)
        return value

    def validate_secret(self, value: str) -> str:
        if problem := signatures.secret_problem(value):
            raise serializers.ValidationError(problem)
        return value


class EndpointSerializer(serializers.Serializer):
    id = serializers.CharField()
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENT_TYPES))
    agents = serializers.ListField(child=serializers.CharField())
    active = serializers.BooleanField()
    format = serializers.ChoiceField(choices=WebhookEndpoint.Format.choices)
    createdAt = serializers.DateTimeField()
    secret = serializers.CharField(required=False, help_text="Only in the answer to a POST that generated it.")


class DeliverySerializer(serializers.Serializer):
    id = serializers.CharField()
    eventId = serializers.CharField()
    type = serializers.ChoiceField(choices=EVENT_TYPES)
    status = serializers.ChoiceField(choices=WebhookDelivery.Status.choices)
    attempts = serializers.IntegerField()
    responseStatus = serializers.IntegerField(allow_null=True)
    nextAttemptAt = serializers.DateTimeField(allow_null=True)
    lastAttemptAt = serializers.DateTimeField(allow_null=True)
    lastError = serializers.CharField(allow_null=True)
    createdAt = serializers.DateTimeField()


EndpointListSerializer = list_of(EndpointSerializer, "WebhookEndpointList")
DeliveryListSerializer = list_of(DeliverySerializer, "WebhookDeliveryList")


# --- views --------------------------------------------------------------------------------------
class EndpointApiView(ApiView):
    permission_classes = [StaffWithModelPermission]
    model_name = "webhookendpoint"

    def validated(self, *, partial: bool) -> dict:
        body = self.body()
        if not isinstance(body, dict):
            raise AgentRunError("INVALID_REQUEST", "the body must be a JSON object")
        check_text(body, "the body")
        serializer = EndpointInputSerializer(data=body, partial=partial)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def endpoint(self, endpoint_id: str) -> WebhookEndpoint:
        endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id).first()
        if endpoint is None:
            raise AgentRunError("NOT_FOUND", f"No webhook endpoint {endpoint_id}.")
        return endpoint


class EndpointListView(EndpointApiView):
    @extend_schema(
        operation_id="webhook_endpoints_list",
        tags=["webhooks"],
        parameters=CURSOR_PARAMS,
        responses={200: EndpointListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        return Response(cursor_page(WebhookEndpoint.objects.all(), request.query_params))

    @extend_schema(
        operation_id="webhook_endpoints_create",
        tags=["webhooks"],
        request={JSON: EndpointInputSerializer},
        responses={201: EndpointSerializer, **_errors(400, 401, 403, 413)},
    )
    def post(self, request: Request) -> Response:
        fields = self.validated(partial=False)
        generated = None if "secret" in fields else signatures.new_secret()
        endpoint = WebhookEndpoint.objects.create(secret=fields.pop("secret", generated), owner=request.user, **fields)
        body = endpoint.to_dict() | ({"secret": generated} if generated else {})
        return Response(body, status=201)


class EndpointDetailView(EndpointApiView):
    @extend_schema(
        operation_id="webhook_endpoints_retrieve",
        tags=["webhooks"],
        responses={200: EndpointSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002 - the contract's path parameter
        return Response(self.endpoint(id).to_dict())

    @extend_schema(
        operation_id="webhook_endpoints_partial_update",
        tags=["webhooks"],
        request={JSON: EndpointInputSerializer},
        responses={200: EndpointSerializer, **_errors(400, 401, 403, 404, 413)},
    )
    def patch(self, request: Request, id: str) -> Response:  # noqa: A002
        endpoint = self.endpoint(id)
        for name, value in self.validated(partial=True).items():
            setattr(endpoint, name, value)
        endpoint.owner = request.user  # it now shows what the person who changed it may see
        endpoint.save()
        return Response(endpoint.to_dict())

    @extend_schema(
        operation_id="webhook_endpoints_destroy",
        tags=["webhooks"],
        responses={204: None, **_errors(400, 401, 403, 404)},
    )
    def delete(self, request: Request, id: str) -> Response:  # noqa: A002
        self.endpoint(id).delete()
        return Response(status=204)


class DeliveryListView(EndpointApiView):
    model_name = "webhookdelivery"

    @extend_schema(
        operation_id="webhook_endpoints_deliveries_list",
        tags=["webhooks"],
        parameters=CURSOR_PARAMS,
        responses={200: DeliveryListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002
        deliveries = WebhookDelivery.objects.filter(endpoint=self.endpoint(id)).select_related("event")
        return Response(cursor_page(deliveries, request.query_params))


# --- Slack destinations (docs/api.md#slack-destinations) -----------------------------------------------
def _no_control_characters(value: str) -> str:
    if any(ch.isspace() or ord(ch) < 32 for ch in value):
        raise serializers.ValidationError("must not contain spaces or control characters")
    return value


class SlackDestinationInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, help_text="What the admin and the delivery log call it.")
    botToken = serializers.CharField(  # noqa: N815 - the contract's name
        max_length=255,
        trim_whitespace=False,
        help_text="Write-only. The Slack app's bot token (xoxb-…), with the chat:write scope.",
    )
    channel = serializers.CharField(max_length=80, help_text="The channel's id (C0123ABCD) or #name.")
    agents = serializers.ListField(
        child=serializers.CharField(max_length=128), required=False, help_text="Agent ids; empty or omitted: all."
    )
    active = serializers.BooleanField(required=False)

    def validate_botToken(self, value: str) -> str:  # noqa: N802
        return _no_control_characters(value)

    def validate_channel(self, value: str) -> str:
        return _no_control_characters(value)


class SlackDestinationSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    channel = serializers.CharField()
    agents = serializers.ListField(child=serializers.CharField())
    active = serializers.BooleanField()
    createdAt = serializers.DateTimeField()


class SlackDeliverySerializer(serializers.Serializer):
    id = serializers.CharField()
    messageId = serializers.CharField()
    eventId = serializers.CharField(allow_null=True)
    action = serializers.ChoiceField(choices=SlackDelivery.Action.choices)
    status = serializers.ChoiceField(choices=SlackDelivery.Status.choices)
    attempts = serializers.IntegerField()
    responseStatus = serializers.IntegerField(allow_null=True)
    nextAttemptAt = serializers.DateTimeField(allow_null=True)
    lastAttemptAt = serializers.DateTimeField(allow_null=True)
    lastError = serializers.CharField(allow_null=True)
    createdAt = serializers.DateTimeField()


SlackDestinationListSerializer = list_of(SlackDestinationSerializer, "SlackDestinationList")
SlackDeliveryListSerializer = list_of(SlackDeliverySerializer, "SlackDeliveryList")
SLACK_FIELDS = {"name": "name", "botToken": "bot_token", "channel": "channel", "agents": "agents", "active": "active"}


class SlackApiView(ApiView):
    permission_classes = [StaffWithModelPermission]
    model_name = "slackdestination"

    def validated(self, *, partial: bool) -> dict:
        """The body's fields under the model's names; unknown keys refused, nothing changed."""
        body = self.body()
        if not isinstance(body, dict):
            raise AgentRunError("INVALID_REQUEST", "the body must be a JSON object")
        unknown = sorted(key for key in body if key not in SLACK_FIELDS)
        if unknown:
            raise AgentRunError(
                "INVALID_REQUEST",
                f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}",
                details={"unknownFields": unknown},
            )
        check_text(body, "the body")
        serializer = SlackDestinationInputSerializer(data=body, partial=partial)
        serializer.is_valid(raise_exception=True)
        return {SLACK_FIELDS[key]: value for key, value in serializer.validated_data.items()}

    def destination(self, destination_id: str) -> SlackDestination:
        destination = SlackDestination.objects.filter(pk=destination_id).first()
        if destination is None:
            raise AgentRunError("NOT_FOUND", f"No Slack destination {destination_id}.")
        return destination


class SlackDestinationListView(SlackApiView):
    @extend_schema(
        operation_id="slack_destinations_list",
        tags=["slack"],
        parameters=CURSOR_PARAMS,
        responses={200: SlackDestinationListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        return Response(cursor_page(SlackDestination.objects.all(), request.query_params))

    @extend_schema(
        operation_id="slack_destinations_create",
        tags=["slack"],
        request={JSON: SlackDestinationInputSerializer},
        responses={201: SlackDestinationSerializer, **_errors(400, 401, 403, 413)},
    )
    def post(self, request: Request) -> Response:
        fields = self.validated(partial=False)
        destination = SlackDestination(owner=request.user)
        for name, value in fields.items():
            setattr(destination, name, value)
        destination.save()
        return Response(destination.to_dict(), status=201)


class SlackDestinationDetailView(SlackApiView):
    @extend_schema(
        operation_id="slack_destinations_retrieve",
        tags=["slack"],
        responses={200: SlackDestinationSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002 - the contract's path parameter
        return Response(self.destination(id).to_dict())

    @extend_schema(
        operation_id="slack_destinations_partial_update",
        tags=["slack"],
        request={JSON: SlackDestinationInputSerializer},
        responses={200: SlackDestinationSerializer, **_errors(400, 401, 403, 404, 413)},
    )
    def patch(self, request: Request, id: str) -> Response:  # noqa: A002
        destination = self.destination(id)
        for name, value in self.validated(partial=True).items():
            setattr(destination, name, value)
        destination.owner = request.user  # it now shows what the person who changed it may see
        destination.save()
        return Response(destination.to_dict())

    @extend_schema(
        operation_id="slack_destinations_destroy",
        tags=["slack"],
        responses={204: None, **_errors(400, 401, 403, 404)},
    )
    def delete(self, request: Request, id: str) -> Response:  # noqa: A002
        self.destination(id).delete()
        return Response(status=204)


class SlackDeliveryListView(SlackApiView):
    model_name = "slackdelivery"

    @extend_schema(
        operation_id="slack_destinations_deliveries_list",
        tags=["slack"],
        parameters=CURSOR_PARAMS,
        responses={200: SlackDeliveryListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002
        deliveries = SlackDelivery.objects.filter(message__destination=self.destination(id))
        return Response(cursor_page(deliveries, request.query_params))
