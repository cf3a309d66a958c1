"""Models: the protocol, the model events, and the bundled models.

``ScriptedModel`` is a deterministic model for tests; ``DemoModel`` is the offline
default that powers ``make demo`` (clearly labelled, not an LLM).
"""

from .._model import Finish as Finish
from .._model import Model as Model
from .._model import ModelEvent as ModelEvent
from .._model import ModelRequest as ModelRequest
from .._model import TextDelta as TextDelta
from .._model import ToolCallDone as ToolCallDone
from .._model import ToolSpec as ToolSpec
from .._model import Usage as Usage
from ._demo import DemoModel as DemoModel
from ._scripted import ScriptedModel as ScriptedModel
from ._scripted import Turn as Turn

__all__ = [
    "DemoModel",
    "Finish",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "ScriptedModel",
    "TextDelta",
    "ToolCallDone",
    "ToolSpec",
    "Turn",
    "Usage",
]
