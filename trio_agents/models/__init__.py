"""Models: the protocol, the model events, and the bundled models.

``OpenAIChatModel`` (OpenAI and every Chat Completions-compatible server),
``OpenAIResponsesModel`` (the Responses API) and ``AnthropicModel`` stream over httpx;
``from_string`` builds one from a spec such as ``"openai:gpt-4o-mini"`` (raising
``ModelSpecError`` for one it will not guess at). ``FallbackModel`` tries the next
model when one fails before its first output; ``RateLimit`` throttles a model's requests
(requests and tokens per minute, concurrency); ``TokenPrices`` prices a model
genai-prices does not know. ``ScriptedModel`` is a deterministic
model for tests; ``DemoModel`` is the offline default that powers ``make demo``
(clearly labelled, not an LLM).
"""

from .._model import FINAL_ANSWER_TOOL as FINAL_ANSWER_TOOL
from .._model import Finish as Finish
from .._model import Model as Model
from .._model import ModelEvent as ModelEvent
from .._model import ModelRequest as ModelRequest
from .._model import ModelStrings, register_model_strings
from .._model import OutputSpec as OutputSpec
from .._model import TextDelta as TextDelta
from .._model import ToolCallDone as ToolCallDone
from .._model import ToolSpec as ToolSpec
from .._model import Usage as Usage
from ._anthropic import AnthropicModel as AnthropicModel
from ._demo import DemoModel as DemoModel
from ._fallback import FallbackError as FallbackError
from ._fallback import FallbackModel as FallbackModel
from ._model_string import ModelSpecError as ModelSpecError
from ._model_string import from_string as from_string
from ._model_string import model_from_string, redact
from ._openai import OpenAIChatModel as OpenAIChatModel
from ._prices import TokenPrices as TokenPrices
from ._ratelimit import RateLimit as RateLimit
from ._responses import OpenAIResponsesModel as OpenAIResponsesModel
from ._scripted import ScriptedModel as ScriptedModel
from ._scripted import Turn as Turn

# What makes Agent(model="openai:...") work: the run core resolves model strings through
# this registration, never by importing this package (it sits below the models).
register_model_strings(ModelStrings(resolve=model_from_string, redact=redact, default=DemoModel))

__all__ = [
    "FINAL_ANSWER_TOOL",
    "AnthropicModel",
    "DemoModel",
    "FallbackError",
    "FallbackModel",
    "Finish",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "ModelSpecError",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "OutputSpec",
    "RateLimit",
    "ScriptedModel",
    "TextDelta",
    "TokenPrices",
    "ToolCallDone",
    "ToolSpec",
    "Turn",
    "Usage",
    "from_string",
]
