"""Request and response shapes of docs/api.md, for the OpenAPI schema.

Bodies are validated by ``agentrun.api.bodies`` and the engine (the websocket consumer shares them), so these
serializers describe; they do not validate. Responses are the models' ``to_dict()``.
"""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from agentrun.core.errors import HTTP_STATUS
from agentrun.core.models import Decision, Run, RunStep

ERROR_CODES = [*HTTP_STATUS, "METHOD_NOT_ALLOWED", "NOT_ACCEPTABLE", "THROTTLED"]
ANY = serializers.JSONField  # any JSON value


# --- errors --------------------------------------------------------------------------------------
class ErrorBodySerializer(serializers.Serializer):
    code = serializers.ChoiceField(choices=ERROR_CODES)
    message = serializers.CharField()
    details = serializers.DictField(required=False)


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


# --- agents --------------------------------------------------------------------------------------
class ToolSerializer(serializers.Serializer):
    id = serializers.CharField()
    requiresApproval = serializers.BooleanField()
    background = serializers.BooleanField()
    resumeSchema = serializers.DictField(allow_null=True)
    risk = serializers.ChoiceField(choices=["low", "medium", "high"])


class AgentSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    tools = ToolSerializer(many=True)
    agents = serializers.ListField(child=serializers.CharField())


def list_of(item: type[serializers.Serializer], name: str) -> type[serializers.Serializer]:
    """``{object: "list", data: [item], firstId, lastId, hasMore}``."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "object": serializers.ChoiceField(choices=["list"]),
            "data": item(many=True),
            "firstId": serializers.CharField(allow_null=True),
            "lastId": serializers.CharField(allow_null=True),
            "hasMore": serializers.BooleanField(),
        },
    )


# --- runs ----------------------------------------------------------------------------------------
class ApprovalGivenSerializer(serializers.Serializer):
    decidedBy = serializers.CharField(allow_null=True)
    decidedAt = serializers.DateTimeField()


class ApprovalsSerializer(serializers.Serializer):
    required = serializers.IntegerField(min_value=1)
    given = ApprovalGivenSerializer(many=True)


# Request bodies are declared once, in agentrun/api/bodies.py (pydantic: they parse and document).
class UsageSerializer(serializers.Serializer):
    promptTokens = serializers.IntegerField()
    completionTokens = serializers.IntegerField()
    totalTokens = serializers.IntegerField()


class AgentRunToolCallSerializer(serializers.Serializer):
    toolCallId = serializers.CharField()
    toolName = serializers.CharField()
    args = ANY(allow_null=True)
    requiresApproval = serializers.BooleanField()
    suspendPayload = ANY(allow_null=True)
    resumeSchema = serializers.DictField(allow_null=True)
    risk = serializers.ChoiceField(choices=["low", "medium", "high"], help_text="How dangerous the call is.")
    argsFingerprint = serializers.CharField(
        help_text="sha256 (hex) of the canonical JSON of args; send it with a decision to bind it to these args."
    )
    approvals = ApprovalsSerializer(
        help_text="How many distinct people must approve the arguments shown, and who did so far."
    )
    innerAgentId = serializers.CharField(required=False)
    innerRunId = serializers.CharField(required=False)
    innerToolCallId = serializers.CharField(required=False)
    subAgent = inline_serializer(
        "SurfacedCall",
        {
            "agentId": serializers.CharField(),
            "runId": serializers.CharField(),
            "toolCallId": serializers.CharField(),
            "toolName": serializers.CharField(),
            "args": ANY(allow_null=True),
        },
        required=False,
        help_text="A call surfaced from a sub-agent: the inner call the reviewer sees (argsFingerprint is of its "
        "args).",
    )


class GenerateResponseSerializer(serializers.Serializer):
    runId = serializers.CharField()
    status = serializers.ChoiceField(choices=Run.Status.choices)
    text = serializers.CharField(allow_blank=True)
    toolCalls = serializers.ListField(child=serializers.DictField())
    finishReason = serializers.CharField()
    usage = UsageSerializer(allow_null=True)
    suspended = AgentRunToolCallSerializer(many=True)


# --- the listing contract ------------------------------------------------------------------------
class AgentRunSerializer(serializers.Serializer):
    runId = serializers.CharField()
    agentId = serializers.CharField()
    status = serializers.ChoiceField(choices=["suspended"])
    threadId = serializers.CharField()
    resourceId = serializers.CharField(allow_null=True)
    createdAt = serializers.DateTimeField()
    suspendedAt = serializers.DateTimeField()
    startedBy = serializers.CharField(allow_null=True, help_text="Who started the run (null: from Python).")
    toolCalls = AgentRunToolCallSerializer(many=True)


class SuspendedRunsSerializer(serializers.Serializer):
    runs = AgentRunSerializer(many=True)
    total = serializers.IntegerField(min_value=0)


# --- decisions -----------------------------------------------------------------------------------
class DecisionAcceptedSerializer(serializers.Serializer):
    runId = serializers.CharField()
    toolCallId = serializers.CharField()
    decision = serializers.ChoiceField(choices=["approve", "decline", "resume"])
    status = serializers.ChoiceField(choices=Run.Status.choices)
    approvals = ApprovalsSerializer(
        required=False,
        help_text='A call that needs several approvals: status stays "suspended" until the last one.',
    )


class BatchDecisionResultSerializer(serializers.Serializer):
    toolCallId = serializers.CharField()
    decision = serializers.ChoiceField(choices=["approve", "decline", "resume"])
    approvals = ApprovalsSerializer(required=False)


class BatchDecisionAcceptedSerializer(serializers.Serializer):
    runId = serializers.CharField()
    decisions = BatchDecisionResultSerializer(many=True)
    status = serializers.ChoiceField(choices=Run.Status.choices)


class DecisionSerializer(serializers.Serializer):
    id = serializers.CharField()
    runId = serializers.CharField()
    agentId = serializers.CharField()
    threadId = serializers.CharField()
    toolCallId = serializers.CharField()
    toolName = serializers.CharField()
    kind = serializers.ChoiceField(choices=Decision.Kind.choices)
    args = ANY(allow_null=True)
    editedArgs = ANY(allow_null=True)
    resumeData = ANY(allow_null=True)
    reason = serializers.CharField(allow_null=True)
    decidedBy = serializers.CharField(allow_null=True)
    via = serializers.ChoiceField(choices=Decision.Via.choices)
    decidedAt = serializers.DateTimeField()
    details = serializers.DictField(
        required=False,
        help_text='Automatic decisions only (via policy): what decided, {"policy": "grant", "grantId", …} or '
        '{"policy": "timeout", "onTimeout", …}.',
    )
    argsFingerprint = serializers.CharField(
        allow_null=True, help_text="The fingerprint of the arguments the decision was made on (what was shown)."
    )
    subAgent = inline_serializer(
        "DecidedSurfacedCall",
        {
            "agentId": serializers.CharField(),
            "runId": serializers.CharField(),
            "toolCallId": serializers.CharField(),
            "toolName": serializers.CharField(),
            "args": ANY(allow_null=True),
            "editedArgs": ANY(allow_null=True),
        },
        required=False,
        help_text="A call surfaced from a sub-agent: the inner call the reviewer saw, and its edit.",
    )


# --- runs, steps, messages -----------------------------------------------------------------------
class LastErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class RunSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["thread.run"])
    agentId = serializers.CharField()
    threadId = serializers.CharField()
    resourceId = serializers.CharField(allow_null=True)
    parentRunId = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=Run.Status.choices)
    createdAt = serializers.DateTimeField()
    startedAt = serializers.DateTimeField(allow_null=True)
    suspendedAt = serializers.DateTimeField(allow_null=True)
    completedAt = serializers.DateTimeField(allow_null=True)
    failedAt = serializers.DateTimeField(allow_null=True)
    cancelledAt = serializers.DateTimeField(allow_null=True)
    expiredAt = serializers.DateTimeField(allow_null=True)
    expiresAt = serializers.DateTimeField(allow_null=True)
    lastError = LastErrorSerializer(allow_null=True)
    usage = UsageSerializer(allow_null=True)
    metadata = serializers.DictField(child=serializers.CharField())
    startedBy = serializers.CharField(allow_null=True, help_text="Who started the run (null: from Python).")


class StepSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["thread.run.step"])
    type = serializers.ChoiceField(choices=RunStep.Type.choices)
    assistantId = serializers.CharField()
    threadId = serializers.CharField()
    runId = serializers.CharField()
    status = serializers.ChoiceField(choices=RunStep.Status.choices)
    stepDetails = serializers.DictField(
        help_text='{type: "message_creation", messageCreation: {messageId}} or '
        '{type: "tool_calls", toolCalls: [{id, type: "function", function: {name, arguments, output}}]}'
    )
    lastError = LastErrorSerializer(allow_null=True)
    createdAt = serializers.DateTimeField()
    completedAt = serializers.DateTimeField(allow_null=True)
    cancelledAt = serializers.DateTimeField(allow_null=True)
    failedAt = serializers.DateTimeField(allow_null=True)
    expiredAt = serializers.DateTimeField(allow_null=True)
    usage = UsageSerializer(allow_null=True)
    metadata = serializers.DictField(child=serializers.CharField())


class MessageSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["thread.message"])
    threadId = serializers.CharField()
    runId = serializers.CharField(allow_null=True)
    role = serializers.ChoiceField(choices=["system", "user", "assistant", "tool"])
    content = serializers.CharField(allow_blank=True)
    createdAt = serializers.DateTimeField()
    toolCalls = serializers.ListField(child=serializers.DictField(), required=False)
    toolCallId = serializers.CharField(allow_null=True, required=False)
    toolName = serializers.CharField(allow_null=True, required=False)
    toolStatus = serializers.CharField(allow_null=True, required=False)


class BackgroundTaskSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["background_task"])
    runId = serializers.CharField()
    agentId = serializers.CharField()
    threadId = serializers.CharField()
    toolCallId = serializers.CharField()
    toolName = serializers.CharField()
    args = ANY()
    status = serializers.ChoiceField(choices=["pending", "running", "completed", "failed", "cancelled", "timed_out"])
    createdAt = serializers.DateTimeField()


AgentListSerializer = list_of(AgentSerializer, "AgentList")
StepListSerializer = list_of(StepSerializer, "StepList")
MessageListSerializer = list_of(MessageSerializer, "MessageList")
DecisionListSerializer = list_of(DecisionSerializer, "DecisionList")
BackgroundTaskListSerializer = list_of(BackgroundTaskSerializer, "BackgroundTaskList")
