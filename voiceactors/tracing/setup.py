"""Which exporter the standard ``OTEL_*`` environment variables ask for.

Tracing is off unless one of them turns it on:

* ``OTEL_TRACES_EXPORTER=otlp`` (OTLP over HTTP, protobuf: the ``otel``
  extra's ``opentelemetry-exporter-otlp-proto-http``) or ``console`` (spans
  as JSON on standard output, for a look by hand); ``none`` keeps it off;
* with ``OTEL_TRACES_EXPORTER`` unset, an endpoint
  (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
  means ``otlp``;
* ``OTEL_SDK_DISABLED=true`` keeps it off whatever else is set.

The rest is the SDK's and the exporter's own reading of the standard
variables: the endpoint, headers and timeout (``OTEL_EXPORTER_OTLP_*``), the
sampler (``OTEL_TRACES_SAMPLER``, ``_ARG``), the batch processor
(``OTEL_BSP_*``), the resource (``OTEL_RESOURCE_ATTRIBUTES``); the service is
``voiceactors`` unless ``OTEL_SERVICE_NAME`` (or the resource attributes) name
another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Mapping

SERVICE = "voiceactors"


class Exporter(StrEnum):
    """The span exporters ``OTEL_TRACES_EXPORTER`` may name here."""

    OTLP = "otlp"
    CONSOLE = "console"
    NONE = "none"


class TracingUnavailable(RuntimeError):
    """The environment asks for traces this installation cannot send."""


@dataclass(frozen=True)
class Choice:
    """What the environment asks for: an exporter, or None (off)."""

    exporter: Exporter | None


def choice(env: Mapping[str, str]) -> Choice:
    """The exporter the variables name (None: tracing stays off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Choice(None)
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not named:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return Choice(Exporter.OTLP if endpoint else None)
    first = named.split(",")[0].strip()     # the variable may list several; the first is used
    try:
        exporter = Exporter(first)
    except ValueError:
        raise TracingUnavailable(f"OTEL_TRACES_EXPORTER={first!r}: use otlp, console or none") from None
    return Choice(None if exporter is Exporter.NONE else exporter)


def _exporter(kind: Exporter) -> Any:
    if kind is Exporter.CONSOLE:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(service_name=SERVICE)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TracingUnavailable("OTLP traces need the otel extra: pip install 'voiceactors[otel]'") from None
    return OTLPSpanExporter()


def provider_from_env(env: Mapping[str, str] | None = None) -> Any:
    """An SDK ``TracerProvider`` exporting as the environment asks, or None (off).
    Raises ``TracingUnavailable`` for an exporter named but not installed or unknown."""
    env = os.environ if env is None else env
    wanted = choice(env).exporter
    if wanted is None:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = "OTEL_SERVICE_NAME" in env or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": SERVICE}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(wanted)))
    return provider
