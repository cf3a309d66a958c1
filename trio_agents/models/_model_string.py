"""``from_string``: build a model from a short spec, for the CLI and config files."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any, Final

from .._exceptions import TrioAgentsError
from .._model import Model

__all__ = ["ModelSpecError", "from_string", "model_from_string"]

ACCEPTED_FORMS: Final = (
    '"demo", "openai:<model>", "openai-responses:<model>", "anthropic:<model>",'
    ' each with an optional "@<base_url>"'
    ' (e.g. "openai:gpt-4o-mini", "openai-responses:gpt-5-mini",'
    ' "anthropic:claude-3-5-haiku-latest", "openai:llama3.1:8b@http://127.0.0.1:11434/v1")'
)

PROVIDERS: Final = ("openai", "openai-responses", "anthropic")

# The separator between a model name and its base URL: the LAST "@" that starts a URL
# with one of these schemes (docs/models.md, "Model strings").
_SCHEMES: Final = ("http://", "https://")
_SEPARATORS: Final = tuple("@" + scheme for scheme in _SCHEMES)
# A host as a model string may name it: a DNS name or IPv4 address in ASCII, or an IPv6
# literal in brackets. Anything else (percent escapes, non-ASCII look-alikes) is refused
# rather than left to a URL parser to interpret.
_HOST: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
# What may follow an "@" inside a model name (Vertex AI's "claude-3-5-sonnet@20240620"):
# no "/", ":" or ".", which would make it read as a host named without a scheme.
_NAME_TAG: Final = re.compile(r"[A-Za-z0-9_-]+")


class ModelSpecError(TrioAgentsError, ValueError):
    """A model string that names a base URL the library will not guess at.

    Its message never contains the string's credentials (user info is shown as
    ``***``). ``Agent(model=...)`` raises a ``ValueError`` with its message. Also a
    ``ValueError`` itself, so ``except ValueError`` keeps catching it."""


def redact(spec: str) -> str:
    """``spec`` with the user info of any URL in it (``//user:secret@``) replaced by
    ``//***@``, for error messages."""
    return re.sub(r"//[^/@\s]*@", "//***@", spec)


def _refuse(spec: str, problem: str) -> ModelSpecError:
    return ModelSpecError(f"model string {redact(spec)!r}: {problem}")


def _split_base_url(spec: str, rest: str) -> tuple[str, str | None]:
    """Split ``<model>@<base_url>`` at the last ``@`` followed by ``http://`` or
    ``https://``; refuse a string whose name still holds a URL or a scheme-less host."""
    cut = max(rest.rfind(separator) for separator in _SEPARATORS)
    if cut < 0:
        model, url = rest, None
    else:
        model, url = rest[:cut], rest[cut + 1 :]
    if "://" in model:
        raise _refuse(
            spec,
            "the model name holds a URL; a base URL is given once, after the last '@',"
            " and starts with http:// or https:// (lower case)",
        )
    for tag in model.split("@")[1:]:
        if not tag:
            raise _refuse(spec, "an '@' in it is followed by nothing")
        if not _NAME_TAG.fullmatch(tag) or tag.lower() == "localhost":
            raise _refuse(
                spec,
                f"'@{tag}' in the model name looks like a host without a scheme; write"
                " the base URL as '@http://HOST:PORT/PATH' or '@https://...'",
            )
    if url is not None:
        _check_base_url(spec, url)
    return model, url


def _check_base_url(spec: str, url: str) -> None:
    """Refuse a base URL whose host is not exactly what it reads as."""
    if not url.isascii():
        raise _refuse(spec, "the base URL has non-ASCII characters (write the host in punycode)")
    if "\\" in url or "%" in url:
        raise _refuse(spec, "the base URL has a '\\' or a '%' escape")
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        # Refused, not sent: the providers authenticate with a header (Bearer token,
        # x-api-key), not with HTTP basic auth, which httpx would make of it; and a model
        # string is logged, shown by `ps`, stored in config files and repr'd.
        raise _refuse(
            spec,
            "the base URL carries credentials (user info before '@'); a model string"
            " never holds secrets: set OPENAI_API_KEY / ANTHROPIC_API_KEY or pass"
            " api_key=, and for a server behind HTTP basic auth build the model with"
            " client=httpx.AsyncClient(auth=...)",
        )
    # "host:port", "host", "[v6]:port" or "[v6]": the port is after the last ":" that
    # is not inside the brackets.
    host, colon, port_text = netloc.rpartition(":")
    port: str | None = port_text
    if not colon or netloc.endswith("]"):
        host, port = netloc, None
    if not host or not _HOST.fullmatch(host):
        raise _refuse(spec, f"the base URL has no valid host (got {netloc!r})")
    if port is not None and not (port.isdigit() and 0 < int(port) <= 65535):
        raise _refuse(spec, f"the base URL's port {port!r} is not a number from 1 to 65535")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise _refuse(spec, "the base URL has a query or fragment; give the API root only")


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

    The base URL starts at the **last** ``@`` that is followed by ``http://`` or
    ``https://``; everything before it is the model name. A string that could send a
    request somewhere its writer did not name is refused (docs/models.md lists the
    rules): a name that still holds ``://``, an ``@`` in the name followed by something
    host-like (``@localhost``, ``@10.0.0.1:8000``), a URL with user info, no valid host,
    a bad port, a query, ``%`` escapes or non-ASCII characters, and whitespace or control
    characters anywhere.

    Raises:
        ValueError: the spec has none of these forms; the message lists them.
        ModelSpecError: (a ``ValueError``) the spec names its base URL ambiguously;
            the message says why, with any credentials in it masked.
    """
    if not isinstance(spec, str):
        raise TypeError(f"a model spec must be a str, not {type(spec).__name__}")
    text = spec.strip()
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise _refuse(spec, "it has whitespace or a control character inside")
    if text == "demo":
        from ._demo import DemoModel

        demo: Model = DemoModel(**options)
        return demo
    provider, colon, rest = text.partition(":")
    if not colon or provider not in PROVIDERS:
        raise ValueError(f"unknown model spec {redact(spec)!r}; use one of {ACCEPTED_FORMS}")
    model, base_url = _split_base_url(spec, rest)
    if not model:
        raise ValueError(f"unknown model spec {redact(spec)!r}; use one of {ACCEPTED_FORMS}")
    if base_url is not None:
        if options.get("base_url") is not None:
            # Two URLs named: neither may silently win.
            raise _refuse(spec, "it names a base URL and base_url= is given too; give one")
        options = {**options, "base_url": base_url}
    if provider == "openai":
        from ._openai import OpenAIChatModel

        return OpenAIChatModel(model, **options)
    if provider == "openai-responses":
        from ._responses import OpenAIResponsesModel

        return OpenAIResponsesModel(model, **options)
    from ._anthropic import AnthropicModel

    return AnthropicModel(model, **options)


def _spec_problem(spec: str) -> tuple[str, str]:
    """What is wrong with a model string ``from_string`` refused, and a likely fix."""
    name = spec.strip()
    spec = redact(spec)
    provider, colon, _rest = name.partition(":")
    if not colon:
        guess = "anthropic" if name.startswith("claude") else "openai"
        hint = f" Did you mean '{guess}:{name}'?" if name else ""
        return f"model string {spec!r} has no provider prefix", hint
    if provider not in PROVIDERS:
        return f"model string {spec!r} names an unknown provider {provider!r}", ""
    return f"model string {spec!r} names no model after {provider + ':'!r}", ""


def model_from_string(spec: str) -> Model:
    """Build the model a model string names (:func:`from_string`), or raise a
    ``ValueError`` naming the string, what is wrong, and the known prefixes: what
    ``Agent(model="...")`` resolves a string with (registered as
    :class:`~trio_agents._model.ModelStrings` by this package) and the CLI's
    ``--model``."""
    try:
        return from_string(spec)
    except ModelSpecError:
        raise  # says exactly what is ambiguous in the string, credentials masked
    except ValueError:
        problem, hint = _spec_problem(spec)
        prefixes = ", ".join(f"{provider}:" for provider in PROVIDERS)
        raise ValueError(
            f'{problem}; known prefixes: {prefixes} (or "demo"),'
            ' e.g. "openai:gpt-4o-mini", "anthropic:claude-3-5-haiku-latest",'
            f' "openai:llama3.1:8b@http://127.0.0.1:11434/v1".{hint}'
        ) from None
