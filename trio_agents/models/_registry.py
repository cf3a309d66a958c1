"""``from_string``: build a model from a short spec, for the CLI and config files."""

from __future__ import annotations

from typing import Any, Final

from .._model import Model

__all__ = ["from_string"]

ACCEPTED_FORMS: Final = (
    '"demo", "openai:<model>", "openai-responses:<model>", "anthropic:<model>",'
    ' each with an optional "@<base_url>"'
    ' (e.g. "openai:gpt-4o-mini", "openai-responses:gpt-5-mini",'
    ' "anthropic:claude-3-5-haiku-latest", "openai:llama3.1:8b@http://127.0.0.1:11434/v1")'
)

PROVIDERS: Final = ("openai", "openai-responses", "anthropic")


def _split_base_url(rest: str) -> tuple[str, str | None]:
    """Split ``model@http(s)://...``; an ``@`` not followed by a URL is part of the name
    (Vertex AI model names such as ``claude-3-5-sonnet@20240620`` contain one)."""
    model, at, url = rest.rpartition("@")
    if at and url.startswith(("http://", "https://")):
        return model, url
    return rest, None


def from_string(spec: str, **options: Any) -> Model:
    """Build a model from a spec string.

    Accepted forms:

    * ``"demo"`` — the offline :class:`~trio_agents.models.DemoModel`;
    * ``"openai:<model>"`` — :class:`~trio_agents.models.OpenAIChatModel`, e.g.
      ``"openai:gpt-4o-mini"``;
    * ``"openai:<model>@<base_url>"`` — an OpenAI-compatible server, e.g.
      ``"openai:llama3.1:8b@http://127.0.0.1:11434/v1"`` (the model name may
      contain ``:``);
    * ``"openai-responses:<model>"`` and ``"openai-responses:<model>@<base_url>"`` —
      :class:`~trio_agents.models.OpenAIResponsesModel` (the Responses API), e.g.
      ``"openai-responses:gpt-5-mini"``;
    * ``"anthropic:<model>"`` and ``"anthropic:<model>@<base_url>"`` —
      :class:`~trio_agents.models.AnthropicModel`, e.g.
      ``"anthropic:claude-3-5-haiku-latest"``.

    ``options`` are passed to the model's constructor (``api_key=``, ``client=``,
    settings such as ``temperature=`` ...).

    Raises:
        ValueError: the spec has none of these forms; the message lists them.
    """
    if not isinstance(spec, str):
        raise TypeError(f"a model spec must be a str, not {type(spec).__name__}")
    text = spec.strip()
    if text == "demo":
        from ._demo import DemoModel

        demo: Model = DemoModel(**options)
        return demo
    provider, colon, rest = text.partition(":")
    model, base_url = _split_base_url(rest)
    if not colon or not model or provider not in PROVIDERS:
        raise ValueError(f"unknown model spec {spec!r}; use one of {ACCEPTED_FORMS}")
    if base_url is not None:
        options = {"base_url": base_url, **options}
    if provider == "openai":
        from ._openai import OpenAIChatModel

        return OpenAIChatModel(model, **options)
    if provider == "openai-responses":
        from ._responses import OpenAIResponsesModel

        return OpenAIResponsesModel(model, **options)
    from ._anthropic import AnthropicModel

    return AnthropicModel(model, **options)
