"""Tracing (DESIGN §13, the `otel` extra): the caller's traceparent through
every attempt, with the SDK's in-memory exporter."""
