"""What must never become a label, an annotation, a log line, a state entry or a forwarded message.

One module, used by every path that takes text from outside (passthrough keys, run labels from file
paths, push, the Alertmanager webhook store, the alert history API, forwarded relay messages, logs, the
state file):

- **names** that say secret, case-insensitive, per ``/``- or ``.``-separated segment: ``HF_TOKEN``,
  ``env/hf_token``, ``config/x/WANDB_API_KEY``, ``aws_secret_access_key``, ``db_password``, ``apiKey``
  (:func:`is_secret_name`). Ordinary verl keys (``timing_per_token_ms/gen``, ``perf/total_num_tokens``)
  are not names of secrets: only a *last* word ``token``, a qualified ``key`` (``api_key``, ``ssh_key``;
  not ``groupKey``) or a word like ``secret``/``password`` anywhere counts;
- **values** that look like a credential whatever their name (:data:`CREDENTIAL`): Hugging Face
  (``hf_…``), GitHub (``ghp_…``, ``github_pat_…``), OpenAI-style (``sk-…``), Slack tokens (``xox?-…``),
  AWS access key ids (``AKIA…``), JWTs (``eyJ….eyJ….…``), ``Bearer <token>``, Google API keys (``AIza…``),
  GitLab (``glpat-…``), npm (``npm_…``), Stripe (``sk_live_…``, ``rk_live_…``, ``whsec_…``), PEM private
  keys (``-----BEGIN … PRIVATE KEY-----`` to its end), Slack/Feishu/Lark/Discord/WeCom/MS Teams/Power
  Automate webhook URLs, Azure SAS signatures (``?…&sig=…``) and passwords in URLs
  (``https://user:pass@host``); percent-encoded text (``https%3A%2F%2Fhooks.slack.com…``) is decoded
  (twice: double encoding) and judged as decoded;
- **assignments** in free text: ``NAME=value``, ``NAME = value``, ``NAME: value``, ``"NAME": "value"``,
  ``'NAME': 'value'``, quoted or not, where NAME is a secret name (:func:`redact`); the unquoted value of
  a password-like name (``password``, ``passphrase``, ``passwd``, ``pwd``) runs to the end of its phrase
  (``password: correct horse battery staple`` — a passphrase has spaces; a token does not).

:func:`redact_tree` applies all of it to a JSON-like tree (a value under a secret-named key is
replaced whole); :class:`RedactingFilter` to every log record.
"""
from __future__ import annotations

import logging
import re
from functools import lru_cache
from urllib.parse import unquote

REDACTED = "[redacted]"
MAX_TREE_DEPTH = 64

# -- names ----------------------------------------------------------------------------------------------
# A word anywhere in a segment that makes it a secret's name.
_SECRET_WORDS = frozenset({"secret", "secrets", "password", "passwd", "passphrase", "credential", "credentials",
                           "apikey", "privatekey", "authorization"})
# A last word that does (``HF_TOKEN``, ``access_token``; ``num_tokens`` and ``token_ms`` do not).
_SECRET_LAST = frozenset({"token", "pwd", "auth", "cookie", "apitoken", "accesstoken", "authtoken"})
# Two adjacent words that do, anywhere (``WANDB_API_KEY``, ``aws_access_key_id``, ``ssh_key``): a key is a
# secret when qualified so; ``groupKey``, ``sort_key`` or a bare ``key`` are not.
_KEY_QUALIFIERS = ("api", "access", "secret", "private", "ssh", "signing", "encryption", "master", "license",
                   "client", "account", "service", "deploy", "session", "app", "auth", "wandb", "hf", "openai")
_SECRET_PAIRS = frozenset({(q, k) for q in _KEY_QUALIFIERS for k in ("key", "keys")}
                          | {("access", "token"), ("auth", "token"), ("refresh", "token"), ("bearer", "token"),
                             ("session", "token"), ("id", "token"), ("client", "secret"), ("webhook", "url"),
                             ("hook", "url")})
_SEGMENTS = re.compile(r"[/.:\s]+")
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def _segment_is_secret(seg: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(seg)]
    if not words:
        return False
    if _SECRET_WORDS.intersection(words) or words[-1] in _SECRET_LAST:
        return True
    return any(p in _SECRET_PAIRS for p in zip(words, words[1:]))


@lru_cache(maxsize=1 << 16)
def is_secret_name(name: str) -> bool:
    """A key/label/field name that says it holds a secret (case-insensitive, any segment)."""
    return any(_segment_is_secret(seg) for seg in _SEGMENTS.split(name) if seg)


# -- values ---------------------------------------------------------------------------------------------
_B = r"(?<![A-Za-z0-9])"  # not glued to a longer word on the left
CREDENTIAL = re.compile(
    _B + r"hf_[A-Za-z0-9]{30,}"
    r"|" + _B + r"api_org_[A-Za-z0-9]{30,}"
    r"|" + _B + r"gh[pousr]_[A-Za-z0-9]{30,}"
    r"|" + _B + r"github_pat_[A-Za-z0-9_]{40,}"
    r"|" + _B + r"sk-(?:proj-|ant-(?:api\d\d-)?|live-|test-)?[A-Za-z0-9_\-]{20,}"
    r"|" + _B + r"xox[abposre]-[A-Za-z0-9-]{10,}"
    r"|" + _B + r"xapp-[A-Za-z0-9-]{10,}"
    r"|" + _B + r"(?:AKIA|ASIA|AIDA|AROA|ANPA|ANVA|AGPA)[0-9A-Z]{16}(?![0-9A-Z])"
    r"|" + _B + r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"
    r"|https?://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]+"
    r"|https?://(?:open\.feishu\.cn|open\.larksuite\.com)/open-apis/bot/v2/hook/[A-Za-z0-9_-]+"
    r"|https?://(?:[a-z]+\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]+"
    r"|" + _B + r"AIza[0-9A-Za-z_-]{30,}"
    r"|" + _B + r"gl(?:pat|dt|rt|ptt|cbt|soat|ffct|oas|imt|agent)-[A-Za-z0-9_-]{20,}"
    r"|" + _B + r"npm_[A-Za-z0-9]{30,}"
    r"|" + _B + r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|" + _B + r"whsec_[A-Za-z0-9+/=]{20,}"
    r"|-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
    r"|[A-Za-z0-9+/=\s\\:,.-]*)"
    r"|https?://qyapi\.weixin\.qq\.com/cgi-bin/webhook/send\?key=[A-Za-z0-9_-]+"
    r"|https?://[A-Za-z0-9.-]*\.webhook\.office\.com/webhookb?2?/[^\s\"'<>]+"
    r"|https?://outlook\.office(?:365)?\.com/webhook/[^\s\"'<>]+"
    r"|https?://[A-Za-z0-9.-]+\.logic\.azure\.com(?::[0-9]+)?/workflows/[^\s\"'<>]+"
    r"|https?://[A-Za-z0-9.-]+\.api\.powerplatform\.com(?::[0-9]+)?/[^\s\"'<>]*workflows/[^\s\"'<>]+",
    re.DOTALL,
)
# Azure shared access signatures (blob/queue URLs, Power Automate triggers): the signature goes, the rest stays.
_SAS_SIG = re.compile(r"(?i)([?&]sig=)([A-Za-z0-9%+/=_-]{10,})")
# A run of URL-ish text with a percent escape in it: decoded and judged as decoded (:func:`_decoded`).
_PCT_RUN = re.compile(r"(?<![^\s\"'<>])(?=[^\s\"'<>]*?%[0-9A-Fa-f]{2})[^\s\"'<>]++")
_PASSWORDISH = re.compile(r"(?i)pass(?:w(?:or)?d|phrase)|pwd")
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]{8,})")
_URL_PASSWORD = re.compile(r"(?i)((?<![a-z0-9+.-])[a-z][a-z0-9+.-]*+://[^/\s:@]++:)([^@\s/]++)(@)")
# name <sep> value, the name possibly quoted (JSON, Python repr), the value quoted or bare. The regex only
# pre-selects names with a secret-ish word in them; is_secret_name judges in the replacement, so
# "num_tokens: 5" stays.
_ASSIGN = re.compile(
    r"""(?P<q>["']?)(?<![A-Za-z0-9_.\-])"""
    r"""(?=[A-Za-z0-9_.\-]*?(?:token|key|secret|passw|passphrase|pwd|auth|cookie|credential))"""
    r"""(?P<name>[A-Za-z0-9_.\-]++)(?P=q)(?P<sep>\s*+[:=]\s*+)"""
    r"""(?P<scheme>(?:bearer|basic|token)\s++)?"""
    r"""(?P<value>"(?:[^"\\]|\\.){0,8192}+"|'(?:[^'\\]|\\.){0,8192}+'|[^\s"',;&}\])]++)"""
    r"""(?P<phrase>(?:[ \t]++[^\s"',;&}\])=:]++(?=[\s"',;&}\])]|$)(?![ \t]*[:=]))*+)""", re.IGNORECASE)
# Linear time on any text (issue 35 item 2: a 16,000-character word took 8 s here, holding the event loop): a name
# starts only where a word starts (the look-behind) and is taken whole (possessive), the secret-ish word is looked
# for inside that one word, a quoted value is at most 8 KiB, and nothing gives back what it took.


def looks_like_credential(text: str) -> bool:
    return CREDENTIAL.search(text) is not None


@lru_cache(maxsize=1 << 16)
def is_secret_key(key: str) -> bool:
    """A verl key or label name that must not be exported: named like a secret, or carrying a credential
    shape itself (``hf_…`` used as a key). Cached: a run logs the same ~100 keys every step (bounded
    cache: endless keys cost a regex each)."""
    return is_secret_name(key) or looks_like_credential(key)


def _assignment(m: re.Match) -> str:
    if not is_secret_name(m.group("name")):
        return m.group(0)
    v = m.group("value")
    if v.startswith(REDACTED[:-1]):
        return m.group(0)  # already redacted as a credential shape
    q = v[0] if v[:1] in ("'", '"') else ""
    # The words after an unquoted value belong to it when the name says password (a passphrase); after a
    # token or key they are the rest of the sentence and stay.
    rest = m.group("phrase") if q or not _PASSWORDISH.search(m.group("name")) else ""
    return (f"{m.group('q')}{m.group('name')}{m.group('q')}{m.group('sep')}{m.group('scheme') or ''}{q}{REDACTED}{q}"
            f"{rest}")


def _decoded(m: re.Match) -> str:
    """A percent-encoded run (``https%3A%2F%2Fhooks.slack.com%2F…``, a form body) judged as decoded: left
    as it was when decoding reveals no secret, else replaced by its redacted decoded form."""
    raw = m.group(0)
    dec = unquote(unquote(raw))
    if dec == raw:
        return raw
    red = _redact_plain(dec)
    return raw if red == dec else red


def redact(text: str) -> str:
    """``text`` with every credential shape and every secret assignment replaced by ``[redacted]``
    (percent-encoded text judged as decoded)."""
    if not text:
        return text
    text = _redact_plain(text)
    return _PCT_RUN.sub(_decoded, text) if "%" in text else text


def _redact_plain(text: str) -> str:
    text = CREDENTIAL.sub(REDACTED, text)
    text = _SAS_SIG.sub(lambda m: m.group(1) + REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = _ASSIGN.sub(_assignment, text)
    return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


def redact_tree(obj, _depth: int = 0):
    """Every string of a JSON-like tree redacted; the value under a secret-named key replaced whole.
    Bounded: below ``MAX_TREE_DEPTH`` levels a subtree becomes ``[redacted]``."""
    if isinstance(obj, str):
        return redact(obj)
    if _depth >= MAX_TREE_DEPTH and isinstance(obj, (dict, list)):
        return REDACTED
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str):
                rk = redact(k)
                out[rk] = REDACTED if (is_secret_name(k) and v not in (None, "")) else redact_tree(v, _depth + 1)
            else:
                out[k] = redact_tree(v, _depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact_tree(v, _depth + 1) for v in obj]
    return obj


# -- logs -----------------------------------------------------------------------------------------------
class RedactingFilter(logging.Filter):
    """Redacts a record's message (arguments merged) and its formatted traceback before any handler
    writes it. Installed on every handler by :func:`install_log_redaction`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler's own error path
            return True
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
            record.__dict__.pop("color_message", None)  # uvicorn's coloured copy of the unredacted message
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_FILTER = RedactingFilter()


def install_log_redaction() -> None:
    """Put the redacting filter on every handler that exists now (root, uvicorn's own, ...). Idempotent."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            if _FILTER not in h.filters:
                h.addFilter(_FILTER)
