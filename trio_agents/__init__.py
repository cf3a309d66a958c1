"""trio_agents: a structured-concurrency runner for LLM agents, built on Trio.

Each run is a Trio nursery; ``run.cancel(reason)`` cancels its scope, ``run.inject``
steers it, and ``run.updated`` / ``run.events()`` say what it is doing. See
``docs/`` and the README.
"""

# Model strings ("openai:gpt-4o-mini") resolve through what the models package registers
# on import (_model.ModelStrings): imported here, so they work wherever trio_agents does,
# while the run core below never imports a provider.
from . import models as models
from ._agent import Agent as Agent
from ._entry import open_run as open_run
from ._entry import run as run
from ._entry import serve_run as serve_run
from ._events import EventsDropped as EventsDropped
from ._events import InboxDelivered as InboxDelivered
from ._events import InboxInjected as InboxInjected
from ._events import ModelRequestEvent as ModelRequestEvent
from ._events import ResponseTextDelta as ResponseTextDelta
from ._events import RunChild as RunChild
from ._events import RunEvent as RunEvent
from ._events import RunHandoff as RunHandoff
from ._events import RunItemEvent as RunItemEvent
from ._events import RunStatus as RunStatus
from ._events import RunUpdated as RunUpdated
from ._events import ToolFinished as ToolFinished
from ._events import ToolProgress as ToolProgress
from ._events import ToolStarted as ToolStarted
from ._exceptions import GuardrailTripped as GuardrailTripped
from ._exceptions import InboxFullError as InboxFullError
from ._exceptions import InvalidConversationError as InvalidConversationError
from ._exceptions import MaxDepthExceeded as MaxDepthExceeded
from ._exceptions import ModelError as ModelError
from ._exceptions import RunClosedError as RunClosedError
from ._exceptions import SessionBusyError as SessionBusyError
from ._exceptions import TrioAgentsError as TrioAgentsError
from ._exceptions import UnknownCallError as UnknownCallError
from ._exceptions import UsageLimitExceeded as UsageLimitExceeded
from ._guardrails import GuardrailResult as GuardrailResult
from ._guardrails import InputGuardrail as InputGuardrail
from ._guardrails import OutputGuardrail as OutputGuardrail
from ._guardrails import input_guardrail as input_guardrail
from ._guardrails import output_guardrail as output_guardrail
from ._hooks import RunHooks as RunHooks
from ._items import AssistantMessage as AssistantMessage
from ._items import Item as Item
from ._items import ToolCall as ToolCall
from ._items import ToolResult as ToolResult
from ._items import UserMessage as UserMessage
from ._items import coerce_items as coerce_items
from ._items import conversation_problems as conversation_problems
from ._items import item_from_json as item_from_json
from ._limits import WRAP_UP_MESSAGE as WRAP_UP_MESSAGE
from ._limits import UsageLimits as UsageLimits
from ._log import EventCursor as EventCursor
from ._model import Model as Model
from ._model import ModelRequest as ModelRequest
from ._model import ToolSpec as ToolSpec
from ._model import Usage as Usage
from ._output import JSONSchema as JSONSchema
from ._replay import ModelResponse as ModelResponse
from ._replay import replay as replay
from ._result import RunFailedError as RunFailedError
from ._result import RunResult as RunResult
from ._result import RunStatistics as RunStatistics
from ._result import SubAgentFailed as SubAgentFailed
from ._resume import Resume as Resume
from ._run import CancelMode as CancelMode
from ._run import InjectionId as InjectionId
from ._run import InjectWhen as InjectWhen
from ._run import Run as Run
from ._session_lock import OnBusy as OnBusy
from ._timeline import Span as Span
from ._timeline import SpanKind as SpanKind
from ._timeline import Timeline as Timeline
from ._timeline import timeline as timeline
from ._tools import ApprovalDecision as ApprovalDecision
from ._tools import CallOutcome as CallOutcome
from ._tools import Tool as Tool
from ._tools import ToolArgumentsError as ToolArgumentsError
from ._tools import ToolContext as ToolContext
from ._tools import function_tool as function_tool
from ._window import SUMMARY_PREFIX as SUMMARY_PREFIX
from ._window import KeepLastTurns as KeepLastTurns
from ._window import Summarize as Summarize
from ._window import TokenWindow as TokenWindow
from .sessions import SessionStorageError as SessionStorageError

__version__ = "0.1.0.dev0"

__all__ = [
    "SUMMARY_PREFIX",
    "WRAP_UP_MESSAGE",
    "Agent",
    "ApprovalDecision",
    "AssistantMessage",
    "CallOutcome",
    "CancelMode",
    "EventCursor",
    "EventsDropped",
    "GuardrailResult",
    "GuardrailTripped",
    "InboxDelivered",
    "InboxFullError",
    "InboxInjected",
    "InjectWhen",
    "InjectionId",
    "InputGuardrail",
    "InvalidConversationError",
    "Item",
    "JSONSchema",
    "KeepLastTurns",
    "MaxDepthExceeded",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelRequestEvent",
    "ModelResponse",
    "OnBusy",
    "OutputGuardrail",
    "ResponseTextDelta",
    "Resume",
    "Run",
    "RunChild",
    "RunClosedError",
    "RunEvent",
    "RunFailedError",
    "RunHandoff",
    "RunHooks",
    "RunItemEvent",
    "RunResult",
    "RunStatistics",
    "RunStatus",
    "RunUpdated",
    "SessionBusyError",
    "SessionStorageError",
    "Span",
    "SpanKind",
    "SubAgentFailed",
    "Summarize",
    "Timeline",
    "TokenWindow",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolContext",
    "ToolFinished",
    "ToolProgress",
    "ToolResult",
    "ToolSpec",
    "ToolStarted",
    "TrioAgentsError",
    "UnknownCallError",
    "Usage",
    "UsageLimitExceeded",
    "UsageLimits",
    "UserMessage",
    "coerce_items",
    "conversation_problems",
    "function_tool",
    "input_guardrail",
    "item_from_json",
    "open_run",
    "output_guardrail",
    "replay",
    "run",
    "serve_run",
    "timeline",
]
