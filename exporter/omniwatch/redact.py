"""What must never become a label, an annotation, a log line or a forwarded message.

Two patterns, used by every input path: verl keys *named* like a secret (an ``env/HF_TOKEN`` a trainer
logged by accident), and strings that *look* like a credential (Hugging Face, GitHub, OpenAI-style,
Slack, AWS access keys)."""
from __future__ import annotations

import re
from functools import lru_cache

SECRET_KEY = re.compile(
    r"(?:^|/)[A-Z0-9_]*(?:TOKEN|KEY|PASSWORD|PASSWD|SECRET)[A-Z0-9_]*$"
    r"|(?i:passw(?:or)?d|secret|api[_-]?key|access[_-]?key|auth[_-]?token|private[_-]?key)")
CREDENTIAL = re.compile(
    r"hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{40,}|sk-[A-Za-z0-9_\-]{32,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}")
REDACTED = "[redacted]"
# NAME_TOKEN=value / NAME_KEY: value pasted into a text (an annotation quoting an env dump, say)
ASSIGNED = re.compile(r"\b([A-Z0-9_]*(?:TOKEN|KEY|PASSWORD|PASSWD|SECRET)[A-Z0-9_]*\s*[=:]\s*)([^\s\"',;]+)")


@lru_cache(maxsize=1 << 16)
def is_secret_key(key: str) -> bool:
    """Cached: a run logs the same ~100 keys every step (bounded cache: endless keys cost a regex each)."""
    return SECRET_KEY.search(key) is not None


def looks_like_credential(text: str) -> bool:
    return CREDENTIAL.search(text) is not None


def redact(text: str) -> str:
    return ASSIGNED.sub(lambda m: m.group(1) + REDACTED, CREDENTIAL.sub(REDACTED, text))


def redact_tree(obj):
    """Every string inside a JSON-like tree, credentials replaced."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact(k) if isinstance(k, str) else k: redact_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_tree(v) for v in obj]
    return obj
