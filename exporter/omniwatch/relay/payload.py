"""Alertmanager webhook (version 4) payload: validation and the idempotency key.

Alertmanager adds fields over time (``notification_reason`` 0.32, ``routeLabels`` 0.34, ...), so the
models accept and keep unknown fields; only what the relay relies on is checked. A still-firing
alert carries Go's zero time in ``endsAt``; :func:`go_time` turns that into ``None``.
"""
from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .. import jsonin

GO_ZERO_TIME = "0001-01-01T00:00:00Z"
SUPPORTED_VERSION = "4"
STATUSES = ("firing", "resolved")


class PayloadError(ValueError):
    """A webhook body the relay rejects; ``reason`` is the counted error reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _check_status(v: str) -> str:
    if v not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}")
    return v


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class WebhookAlert(_Lenient):
    status: str
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str
    endsAt: str = GO_ZERO_TIME
    generatorURL: str = ""
    fingerprint: str = ""

    _status = field_validator("status")(_check_status)

    def key(self) -> str:
        """Alertmanager's fingerprint, or a stable hash of the labels when a sender left it out."""
        if self.fingerprint:
            return self.fingerprint
        return hashlib.sha256(json.dumps(self.labels, sort_keys=True).encode()).hexdigest()[:16]


class Notification(_Lenient):
    version: str
    groupKey: str
    status: str
    receiver: str = ""
    alerts: list[WebhookAlert] = Field(min_length=1)
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    truncatedAlerts: int = 0

    _status = field_validator("status")(_check_status)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v != SUPPORTED_VERSION:
            raise ValueError(f"unsupported webhook version {v!r} (expected {SUPPORTED_VERSION!r})")
        return v

    def notification_id(self) -> str:
        """Same group, status and alert set (fingerprint, startsAt, endsAt) -> same id, so a re-send
        (Alertmanager retry, or its restart with a lost notification log) is stored and relayed once."""
        parts = sorted(f"{a.key()}|{a.startsAt}|{a.endsAt}" for a in self.alerts)
        h = hashlib.sha256()
        for p in [self.groupKey, self.status, *parts]:
            h.update(p.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]


def go_time(ts: str | None) -> str | None:
    """Go's zero time (and empty) mean "not set"."""
    if not ts or ts.startswith("0001-01-01"):
        return None
    return ts


def parse(body: bytes) -> Notification:
    """Bytes -> Notification, or PayloadError with a message that says what is wrong."""
    try:
        data = jsonin.loads(body)  # depth-bounded: a 300-deep extra field is a 400, not a 500
    except jsonin.BodyError as e:
        raise PayloadError(e.reason, str(e)) from None
    if not isinstance(data, dict):
        raise PayloadError("bad_shape", f"body must be a JSON object (Alertmanager webhook v4), got {type(data).__name__}")
    try:
        return Notification.model_validate(data)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors()[:5])
        reason = "bad_version" if any(err["loc"] == ("version",) for err in e.errors()) else "bad_shape"
        raise PayloadError(reason, f"not an Alertmanager webhook v4 body: {errs}") from None
