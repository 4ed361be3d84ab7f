"""Trace files: parse recorded traffic and turn it into a replay schedule.

Two formats are accepted; the file's content decides which.

JSON Lines, one request per line (blank lines are skipped)::

    {"offset_ms": 0,     "modality": "fusion", "image_id": 17, "text_chars": 64}
    {"offset_ms": 12.5,  "modality": "vision", "image_id": "cat.jpg"}
    {"offset_ms": 13.0,  "modality": "text",   "text_chars": 120, "priority": "high"}

    offset_ms   number, required   arrival time in ms; replay starts at the smallest
                                   offset and keeps every gap after it
    modality    string, required   text | vision | fusion
    image_id    int or string      required for vision and fusion: equal ids send
                                   byte-identical images (cache hits), distinct ids
                                   distinct images
    text_chars  int >= 1           required for text and fusion: length of the
                                   (freshly generated) text in characters
    priority    string, optional   high | normal | low
    timeout_ms  int, optional      sent as the request's timeout_ms

OpenTelemetry spans in OTLP/JSON: a ``{"resourceSpans": [...]}`` document, a
list of such documents, a list of spans, or JSON Lines of such documents (what
the collector's file exporter writes). A span's arrival time is its
``startTimeUnixNano`` (or ``start_time_unix_nano``), in unix nanoseconds; its
attributes (OTLP key/value list or a plain object) give ``mmserve.modality``,
``mmserve.image_id``, ``mmserve.text_chars`` and optionally
``mmserve.priority`` / ``mmserve.timeout_ms`` (the unprefixed names are
accepted too). Spans without a modality attribute (e.g. internal child spans)
are skipped.

Every problem is a ``TraceFormatError`` naming the line (or span path).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.loadgen.errors import TraceFormatError
from benchmarks.loadgen.request_spec import Arrival, Modality, Priority, RequestSpec

_ATTRIBUTE_PREFIX = "mmserve."
_START_KEYS = ("startTimeUnixNano", "start_time_unix_nano")
_SCOPE_KEYS = ("scopeSpans", "instrumentationLibrarySpans", "scope_spans")


@dataclass(frozen=True)
class TraceRecord:
    """One recorded request: when it arrived and what it asked for."""

    offset_ms: float
    spec: RequestSpec
    location: str


def image_key_for(image_id: int | str) -> int:
    """The pool key of a trace's image id: ints are used as is, strings hashed stably."""
    if isinstance(image_id, int):
        return image_id
    digest = hashlib.sha256(image_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _spec_from_fields(fields: Mapping[str, Any], source: str, location: str) -> RequestSpec:
    """Validate the request fields shared by both formats."""

    def fail(problem: str) -> TraceFormatError:
        return TraceFormatError(source, location, problem)

    raw_modality = fields.get("modality")
    if raw_modality is None:
        raise fail("missing 'modality' (text, vision or fusion)")
    try:
        modality = Modality(str(raw_modality).lower())
    except ValueError as e:
        raise fail(f"unknown modality {raw_modality!r} (expected text, vision or fusion)") from e

    image_key: int | None = None
    raw_image_id = fields.get("image_id")
    if modality.has_image:
        if raw_image_id is None or isinstance(raw_image_id, bool):
            raise fail(f"modality {modality.value} needs 'image_id'")
        if isinstance(raw_image_id, float) and raw_image_id.is_integer():
            raw_image_id = int(raw_image_id)
        if not isinstance(raw_image_id, (int, str)):
            raise fail(f"'image_id' must be an integer or a string, got {raw_image_id!r}")
        image_key = image_key_for(raw_image_id)

    num_text_chars = 0
    raw_text_chars = fields.get("text_chars")
    if modality.has_text:
        if raw_text_chars is None:
            raise fail(f"modality {modality.value} needs 'text_chars'")
        num_text_chars = _as_int(raw_text_chars, "text_chars", fail)
        if num_text_chars < 1:
            raise fail(f"'text_chars' must be >= 1, got {raw_text_chars!r}")

    priority: Priority | None = None
    raw_priority = fields.get("priority")
    if raw_priority is not None:
        try:
            priority = Priority(str(raw_priority).lower())
        except ValueError as e:
            raise fail(f"unknown priority {raw_priority!r} (expected high, normal or low)") from e

    timeout_ms: int | None = None
    if fields.get("timeout_ms") is not None:
        timeout_ms = _as_int(fields["timeout_ms"], "timeout_ms", fail)
        if timeout_ms < 1:
            raise fail(f"'timeout_ms' must be >= 1, got {timeout_ms}")

    return RequestSpec(
        modality=modality,
        image_key=image_key,
        num_text_chars=num_text_chars,
        priority=priority,
        timeout_ms=timeout_ms,
    )


def _as_int(value: Any, name: str, fail: Any) -> int:
    """An integer field that may arrive as int, integral float or numeric string (OTLP intValue)."""
    if isinstance(value, bool):
        raise fail(f"{name!r} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise fail(f"{name!r} must be an integer, got {value!r}")


def _record_from_line(obj: Any, source: str, location: str) -> TraceRecord:
    if not isinstance(obj, dict):
        raise TraceFormatError(
            source, location, f"expected a JSON object (a request or a span document), got {type(obj).__name__}"
        )
    raw_offset = obj.get("offset_ms")
    if raw_offset is None:
        raise TraceFormatError(source, location, "missing 'offset_ms' (arrival offset in ms)")
    if isinstance(raw_offset, bool) or not isinstance(raw_offset, (int, float)) or not math.isfinite(raw_offset):
        raise TraceFormatError(source, location, f"'offset_ms' must be a finite number, got {raw_offset!r}")
    return TraceRecord(float(raw_offset), _spec_from_fields(obj, source, location), location)


def _attribute_value(value: Any) -> Any:
    """Unwrap an OTLP AnyValue (``{"stringValue": "x"}``) or pass a plain value through."""
    if isinstance(value, dict):
        if "intValue" in value:  # OTLP/JSON writes 64-bit ints as strings
            try:
                return int(value["intValue"])
            except (TypeError, ValueError):
                return value["intValue"]
        for kind in ("stringValue", "doubleValue", "boolValue"):
            if kind in value:
                return value[kind]
        return None
    return value


def _span_attributes(span: Mapping[str, Any]) -> dict[str, Any]:
    raw = span.get("attributes") or {}
    pairs: list[tuple[str, Any]]
    if isinstance(raw, list):
        pairs = [(str(item.get("key")), _attribute_value(item.get("value"))) for item in raw if isinstance(item, dict)]
    elif isinstance(raw, dict):
        pairs = [(str(key), _attribute_value(value)) for key, value in raw.items()]
    else:
        pairs = []
    attributes: dict[str, Any] = {}
    for key, value in pairs:
        name = key[len(_ATTRIBUTE_PREFIX) :] if key.startswith(_ATTRIBUTE_PREFIX) else key
        if key.startswith(_ATTRIBUTE_PREFIX) or name not in attributes:
            attributes[name] = value
    return attributes


def _iter_spans(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every span under a span document node, with its path (for error messages)."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            yield from _iter_spans(item, f"{path}[{index}]")
        return
    if not isinstance(node, dict):
        raise TypeError(f"{path or 'document'} is a {type(node).__name__}, not a span document")
    if "resourceSpans" in node or "resource_spans" in node:
        key = "resourceSpans" if "resourceSpans" in node else "resource_spans"
        yield from _iter_spans(node[key] or [], f"{path}.{key}" if path else key)
        return
    for scope_key in _SCOPE_KEYS:
        if scope_key in node:
            for index, scope in enumerate(node[scope_key] or []):
                spans = scope.get("spans") if isinstance(scope, dict) else None
                for span_index, span in enumerate(spans or []):
                    yield f"{path}.{scope_key}[{index}].spans[{span_index}]", span
            return
    yield path or "span", node


def _record_from_span(span: Any, source: str, location: str) -> tuple[int, RequestSpec] | None:
    if not isinstance(span, dict):
        raise TraceFormatError(source, location, f"expected a span object, got {type(span).__name__}")
    attributes = _span_attributes(span)
    if attributes.get("modality") is None:
        return None
    raw_start = next((span[key] for key in _START_KEYS if key in span), None)
    if raw_start is None:
        raise TraceFormatError(source, location, "span has no startTimeUnixNano")
    try:
        start_ns = int(raw_start)
    except (TypeError, ValueError) as e:
        raise TraceFormatError(source, location, f"startTimeUnixNano {raw_start!r} is not an integer") from e
    return start_ns, _spec_from_fields(attributes, source, location)


def _records_from_span_doc(doc: Any, source: str, prefix: str) -> list[tuple[int, RequestSpec, str]]:
    found: list[tuple[int, RequestSpec, str]] = []
    try:
        spans = list(_iter_spans(doc, ""))
    except TypeError as e:
        raise TraceFormatError(source, f"{prefix}document", str(e)) from e
    for path, span in spans:
        location = prefix + path
        parsed = _record_from_span(span, source, location)
        if parsed is not None:
            found.append((parsed[0], parsed[1], location))
    return found


def _is_span_document(doc: Any) -> bool:
    return isinstance(doc, list) or (isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc))


def parse_trace_text(text: str, source: str = "<trace>") -> list[TraceRecord]:
    """Parse a trace in either format; records come back sorted by offset, first at 0 ms."""
    stripped = text.strip()
    if not stripped:
        raise TraceFormatError(source, "line 1", "the trace is empty")
    whole: Any = None
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    if _is_span_document(whole):
        spans = _records_from_span_doc(whole, source, "")
        return _span_records_to_trace(spans, source)

    line_records: list[TraceRecord] = []
    span_records: list[tuple[int, RequestSpec, str]] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        location = f"line {line_number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceFormatError(source, location, f"not valid JSON ({e.msg} at column {e.colno})") from e
        if isinstance(obj, dict) and _is_span_document(obj):
            span_records.extend(_records_from_span_doc(obj, source, f"{location}, "))
        else:
            line_records.append(_record_from_line(obj, source, location))
    if span_records and line_records:
        raise TraceFormatError(source, line_records[0].location, "mixes request records with span documents")
    if span_records:
        return _span_records_to_trace(span_records, source)
    return _normalise(line_records)


def _span_records_to_trace(spans: list[tuple[int, RequestSpec, str]], source: str) -> list[TraceRecord]:
    if not spans:
        raise TraceFormatError(source, "document", "no span carries a mmserve.modality attribute")
    first_ns = min(start_ns for start_ns, _, _ in spans)
    records = [TraceRecord((start_ns - first_ns) / 1e6, spec, location) for start_ns, spec, location in spans]
    return _normalise(records)


def _normalise(records: list[TraceRecord]) -> list[TraceRecord]:
    """Sort by arrival and shift so the first record is at offset 0."""
    ordered = sorted(records, key=lambda record: record.offset_ms)
    first_ms = ordered[0].offset_ms
    return [TraceRecord(record.offset_ms - first_ms, record.spec, record.location) for record in ordered]


def load_trace(path: Path) -> list[TraceRecord]:
    """Read and parse a trace file (see the module docstring for the formats)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceFormatError(str(path), "file", f"cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise TraceFormatError(str(path), "file", "is not UTF-8 text") from e
    return parse_trace_text(text, source=str(path))


def trace_arrivals(records: list[TraceRecord], speed: float, duration_s: float | None) -> list[Arrival]:
    """The replay schedule: offsets divided by ``speed``, cut at ``duration_s`` if given."""
    if not speed > 0.0:
        raise ValueError(f"speed must be > 0, got {speed}")
    arrivals = [Arrival(record.offset_ms / 1000.0 / speed, record.spec) for record in records]
    if duration_s is not None:
        arrivals = [arrival for arrival in arrivals if arrival.intended_offset_s < duration_s]
    return arrivals
