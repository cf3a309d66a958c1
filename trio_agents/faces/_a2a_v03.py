"""A2A 0.3 spoken by the 1.0 face: its method names, and its shapes both ways.

Clients in the wild still send ``message/send``, ``message/stream``, ``tasks/get``,
``tasks/cancel`` and ``tasks/resubscribe``, with 0.3's objects: parts tagged by
``kind``, roles ``"user"`` / ``"agent"``, states ``"input-required"``, ``blocking``
instead of ``returnImmediately``, results unwrapped (a ``Task`` is the result itself,
tagged ``kind: "task"``) and status updates flagged ``final``. One job here: translate a
0.3 request's params into 1.0's and a 1.0 result back into 0.3's, so the face itself
has one set of semantics. The JSON-RPC error codes are the same in both versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["METHODS", "params_from_v03", "result_to_v03"]

METHODS: Final[Mapping[str, str]] = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/list": "ListTasks",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
}
"""The 1.0 method each 0.3 method name is."""

_ROLE_IN: Final = {"user": "ROLE_USER", "agent": "ROLE_AGENT"}
_ROLE_OUT: Final = {v: k for k, v in _ROLE_IN.items()}
_TERMINAL: Final = frozenset({"completed", "failed", "canceled", "rejected"})


def _state_out(state: Any) -> Any:
    """``TASK_STATE_INPUT_REQUIRED`` → ``input-required``."""
    if isinstance(state, str) and state.startswith("TASK_STATE_"):
        return state.removeprefix("TASK_STATE_").lower().replace("_", "-")
    return state


def _part_in(part: Any) -> Any:
    if not isinstance(part, Mapping):
        return part
    out = {k: v for k, v in part.items() if k != "kind"}
    if part.get("kind") == "file" and isinstance(part.get("file"), Mapping):
        file = part["file"]
        out.pop("file")
        if "uri" in file:
            out["url"] = file["uri"]
        if "bytes" in file:
            out["raw"] = file["bytes"]
        if "mimeType" in file:
            out["mediaType"] = file["mimeType"]
    return out


def _message_in(message: Any) -> Any:
    if not isinstance(message, Mapping):
        return message
    out = {k: v for k, v in message.items() if k != "kind"}
    if "role" in out:
        out["role"] = _ROLE_IN.get(out["role"], out["role"])
    if isinstance(out.get("parts"), list):
        out["parts"] = [_part_in(p) for p in out["parts"]]
    return out


def params_from_v03(method: str, params: Any) -> Any:
    """A 0.3 request's params as the 1.0 method :data:`METHODS` names wants them
    (anything malformed is left for the 1.0 validation to refuse)."""
    if not isinstance(params, Mapping):
        return params
    out = dict(params)
    if method == "tasks/list" and isinstance(out.get("status"), str):
        # "input-required" -> "TASK_STATE_INPUT_REQUIRED"
        out["status"] = "TASK_STATE_" + out["status"].upper().replace("-", "_")
    if method in ("message/send", "message/stream"):
        if "message" in out:
            out["message"] = _message_in(out["message"])
        config = out.get("configuration")
        if isinstance(config, Mapping):
            config = dict(config)
            blocking = config.pop("blocking", None)
            if isinstance(blocking, bool):
                config["returnImmediately"] = not blocking
            out["configuration"] = config
    return out


def _part_out(part: Mapping[str, Any]) -> dict[str, Any]:
    if "text" in part:
        return {"kind": "text", **part}
    if "data" in part:
        return {"kind": "data", **part}
    file: dict[str, Any] = {}
    if "url" in part:
        file["uri"] = part["url"]
    if "raw" in part:
        file["bytes"] = part["raw"]
    if "mediaType" in part:
        file["mimeType"] = part["mediaType"]
    return {"kind": "file", "file": file}


def _message_out(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {"kind": "message", **message}
    out["role"] = _ROLE_OUT.get(message.get("role", ""), message.get("role"))
    out["parts"] = [_part_out(p) for p in message.get("parts", ())]
    return out


def _status_out(status: Mapping[str, Any]) -> dict[str, Any]:
    out = {**status, "state": _state_out(status.get("state"))}
    if isinstance(status.get("message"), Mapping):
        out["message"] = _message_out(status["message"])
    return out


def _artifact_out(artifact: Mapping[str, Any]) -> dict[str, Any]:
    return {**artifact, "parts": [_part_out(p) for p in artifact.get("parts", ())]}


def _task_out(task: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "task", **task, "status": _status_out(task["status"])}
    if "artifacts" in task:
        out["artifacts"] = [_artifact_out(a) for a in task["artifacts"]]
    if "history" in task:
        out["history"] = [_message_out(m) for m in task["history"]]
    return out


def result_to_v03(method: str, result: Any) -> Any:
    """A 1.0 result of ``method`` (a 1.0 name) in 0.3's shape."""
    if not isinstance(result, Mapping):
        return result
    if method in ("GetTask", "CancelTask"):
        return _task_out(result)
    if method == "ListTasks":
        return {**result, "tasks": [_task_out(t) for t in result.get("tasks", ())]}
    # SendMessage's SendMessageResponse and the streams' StreamResponse: one of
    # task / message / statusUpdate / artifactUpdate, unwrapped and tagged by kind.
    if "task" in result:
        return _task_out(result["task"])
    if "message" in result:
        return _message_out(result["message"])
    if "statusUpdate" in result:
        update = result["statusUpdate"]
        status = _status_out(update["status"])
        return {
            "kind": "status-update",
            **update,
            "status": status,
            "final": status["state"] in _TERMINAL,
        }
    if "artifactUpdate" in result:
        update = result["artifactUpdate"]
        return {"kind": "artifact-update", **update, "artifact": _artifact_out(update["artifact"])}
    return result
