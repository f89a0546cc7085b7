"""REST for webhook endpoints (docs/notifications.md#25-rest) and Slack destinations (docs/api.md#slack-destinations):
superusers, and staff holding the model permission.

``GET/POST /api/webhook-endpoints/``, ``GET/PATCH/DELETE /api/webhook-endpoints/{id}``,
``GET /api/webhook-endpoints/{id}/deliveries``. ``secret`` is write-only: a POST without one gets a
generated ``whsec_`` secret, shown in that response only. The URL must reach a public address
(``notifications.egress``); whoever creates or changes an endpoint becomes its owner, and it receives
only the events of agents they may view.

``GET/POST /api/slack-destinations/``, ``GET/PATCH/DELETE /api/slack-destinations/{id}``,
``GET /api/slack-destinations/{id}/deliveries``: the same rules (one base view); ``botToken`` is
write-only (required on creation). Both refuse unknown keys (``details.unknownFields``).
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


# --- Slack destinations' shapes (docs/api.md#slack-destinations) -----------------------------------------------
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


# --- views: webhook endpoints and Slack destinations share their rules ------------------------------
class DestinationApiView(ApiView):
    """A place notifications go: staff with the model permission manage it; bodies keep to ``fields``
    (unknown keys refused, ``details.unknownFields``: a misspelled ``agents`` must not widen what it
    receives); whoever creates or changes one becomes its owner."""

    permission_classes = [StaffWithModelPermission]
    model: type[WebhookEndpoint] | type[SlackDestination]
    noun: str
    input_serializer: type[serializers.Serializer]
    fields: dict[str, str]  # the body's key -> the model's field

    def validated(self, *, partial: bool) -> dict:
        """The body's fields under the model's names; anything wrong is a 400 and changes nothing."""
        body = self.body()
        if not isinstance(body, dict):
            raise AgentRunError("INVALID_REQUEST", "the body must be a JSON object")
        unknown = sorted(key for key in body if key not in self.fields)
        if unknown:
            raise AgentRunError(
                "INVALID_REQUEST",
                f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}",
                details={"unknownFields": unknown},
            )
        check_text(body, "the body")
        serializer = self.input_serializer(data=body, partial=partial)
        serializer.is_valid(raise_exception=True)
        return {self.fields[key]: value for key, value in serializer.validated_data.items()}

    def target(self, target_id: str) -> WebhookEndpoint | SlackDestination:
        found = self.model.objects.filter(pk=target_id).first()
        if found is None:
            raise AgentRunError("NOT_FOUND", f"No {self.noun} {target_id}.")
        return found

    def created(self, fields: dict) -> Response:
        target = self.model(owner=self.request.user)
        for name, value in fields.items():
            setattr(target, name, value)
        target.save()
        return Response(target.to_dict(), status=201)

    def listed(self) -> Response:
        return Response(cursor_page(self.model.objects.all(), self.request.query_params))

    def retrieved(self, target_id: str) -> Response:
        return Response(self.target(target_id).to_dict())

    def patched(self, target_id: str) -> Response:
        target = self.target(target_id)
        for name, value in self.validated(partial=True).items():
            setattr(target, name, value)
        target.owner = self.request.user  # it now shows what the person who changed it may see
        target.save()
        return Response(target.to_dict())

    def deleted(self, target_id: str) -> Response:
        self.target(target_id).delete()
        return Response(status=204)


class EndpointApiView(DestinationApiView):
    model = WebhookEndpoint
    model_name = "webhookendpoint"
    noun = "webhook endpoint"
    input_serializer = EndpointInputSerializer
    fields = {name: name for name in EndpointInputSerializer().fields}


class SlackApiView(DestinationApiView):
    model = SlackDestination
    model_name = "slackdestination"
    noun = "Slack destination"
    input_serializer = SlackDestinationInputSerializer
    fields = {"name": "name", "botToken": "bot_token", "channel": "channel", "agents": "agents", "active": "active"}


class EndpointListView(EndpointApiView):
    @extend_schema(
        operation_id="webhook_endpoints_list",
        tags=["webhooks"],
        parameters=CURSOR_PARAMS,
        responses={200: EndpointListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        return self.listed()

    @extend_schema(
        operation_id="webhook_endpoints_create",
        tags=["webhooks"],
        request={JSON: EndpointInputSerializer},
        responses={201: EndpointSerializer, **_errors(400, 401, 403, 413)},
    )
    def post(self, request: Request) -> Response:
        fields = self.validated(partial=False)
        generated = None if "secret" in fields else signatures.new_secret()
        response = self.created(fields | ({"secret": generated} if generated else {}))
        if generated:
            response.data["secret"] = generated  # shown in this answer only
        return response


class EndpointDetailView(EndpointApiView):
    @extend_schema(
        operation_id="webhook_endpoints_retrieve",
        tags=["webhooks"],
        responses={200: EndpointSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002 - the contract's path parameter
        return self.retrieved(id)

    @extend_schema(
        operation_id="webhook_endpoints_partial_update",
        tags=["webhooks"],
        request={JSON: EndpointInputSerializer},
        responses={200: EndpointSerializer, **_errors(400, 401, 403, 404, 413)},
    )
    def patch(self, request: Request, id: str) -> Response:  # noqa: A002
        return self.patched(id)

    @extend_schema(
        operation_id="webhook_endpoints_destroy",
        tags=["webhooks"],
        responses={204: None, **_errors(400, 401, 403, 404)},
    )
    def delete(self, request: Request, id: str) -> Response:  # noqa: A002
        return self.deleted(id)


class DeliveryListView(EndpointApiView):
    model_name = "webhookdelivery"

    @extend_schema(
        operation_id="webhook_endpoints_deliveries_list",
        tags=["webhooks"],
        parameters=CURSOR_PARAMS,
        responses={200: DeliveryListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002
        deliveries = WebhookDelivery.objects.filter(endpoint=self.target(id)).select_related("event")
        return Response(cursor_page(deliveries, request.query_params))


class SlackDestinationListView(SlackApiView):
    @extend_schema(
        operation_id="slack_destinations_list",
        tags=["slack"],
        parameters=CURSOR_PARAMS,
        responses={200: SlackDestinationListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        return self.listed()

    @extend_schema(
        operation_id="slack_destinations_create",
        tags=["slack"],
        request={JSON: SlackDestinationInputSerializer},
        responses={201: SlackDestinationSerializer, **_errors(400, 401, 403, 413)},
    )
    def post(self, request: Request) -> Response:
        return self.created(self.validated(partial=False))


class SlackDestinationDetailView(SlackApiView):
    @extend_schema(
        operation_id="slack_destinations_retrieve",
        tags=["slack"],
        responses={200: SlackDestinationSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002 - the contract's path parameter
        return self.retrieved(id)

    @extend_schema(
        operation_id="slack_destinations_partial_update",
        tags=["slack"],
        request={JSON: SlackDestinationInputSerializer},
        responses={200: SlackDestinationSerializer, **_errors(400, 401, 403, 404, 413)},
    )
    def patch(self, request: Request, id: str) -> Response:  # noqa: A002
        return self.patched(id)

    @extend_schema(
        operation_id="slack_destinations_destroy",
        tags=["slack"],
        responses={204: None, **_errors(400, 401, 403, 404)},
    )
    def delete(self, request: Request, id: str) -> Response:  # noqa: A002
        return self.deleted(id)


class SlackDeliveryListView(SlackApiView):
    model_name = "slackdelivery"

    @extend_schema(
        operation_id="slack_destinations_deliveries_list",
        tags=["slack"],
        parameters=CURSOR_PARAMS,
        responses={200: SlackDeliveryListSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:  # noqa: A002
        deliveries = SlackDelivery.objects.filter(message__destination=self.target(id))
        return Response(cursor_page(deliveries, request.query_params))
