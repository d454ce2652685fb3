"""Keeping credentials out of messages: errors, log lines and command output.

A user may put credentials into a corpus URL (``s3://KEY:SECRET@bucket/corpus``, a presigned
``https://...?X-Amz-Signature=...``) or into storage options. Every place that writes a URL or
an option into text a person or a log collector reads passes it through :func:`redact` first:

- the user info of a URL (everything before the ``@`` of its authority) becomes ``***``, and
  so does a ``name:secret@`` outside a URL (a storage library quoting the bucket part of a URL
  that carried credentials);
- the value of a query parameter that carries a credential (``SECRET_QUERY_PARAMETERS``:
  signatures, tokens, access key ids, ...) becomes ``***``;
- the value of a known secret setting (``SECRET_KEYS``), written ``name=value`` or as a quoted
  mapping entry (``'name': 'value'``), becomes ``***``.

The rest of the text is kept as it is, so a message still names the bucket and the object.
"""

from __future__ import annotations

import re
from typing import Any

#: what stands for a removed secret
MASK = "***"
#: query parameters whose value is a credential (compared without regard to case)
SECRET_QUERY_PARAMETERS = (
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "awsaccesskeyid",
    "signature",
    "sig",
    "token",
    "access_token",
    "key",
    "secret",
    "password",
)
#: settings whose value is a credential, wherever they appear in a message
SECRET_KEYS = (
    "aws_secret_access_key",
    "aws_session_token",
    "aws_access_key_id",
    "secret_access_key",
    "session_token",
    "client_secret",
    "account_key",
    "sas_token",
    "access_token",
    "password",
    "secret",
    "token",
)

#: a value: up to a separator, or a colon that ends it ("URL: message")
_VALUE = r"(?:[^&#;\s:\"',)}\]]|:(?!\s|$))*"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
_USERINFO = re.compile(r"^([^:/]+://)([^?#@]*?)@")
_BARE_USERINFO = re.compile(r"(?<![\w.+\-])[\w.+\-]+:(?!//)[^\s\"'@]+@(?=\w)")
_QUERY = re.compile(
    r"([?&;](?:" + "|".join(map(re.escape, SECRET_QUERY_PARAMETERS)) + r"))=" + _VALUE,
    re.IGNORECASE,
)
_NAMES = "|".join(map(re.escape, SECRET_KEYS))
_ASSIGNED = re.compile(r"(?<![\w\-])(" + _NAMES + r")=" + _VALUE, re.IGNORECASE)
_QUOTED = re.compile(r"([\"'])(" + _NAMES + r")\1(\s*:\s*)([\"'])(.*?)\4", re.IGNORECASE)


def split_user_info(url: str) -> tuple[str, str | None, str]:
    """``url`` as (scheme with ``://``, its user info or None, the rest). User info has no
    ``/`` before its ``@``; a secret that holds one still follows ``key:``."""
    user = _USERINFO.match(url)
    if user is None or ("/" in user.group(2) and ":" not in user.group(2).split("/")[0]):
        scheme, sep, rest = url.partition("://")
        return scheme + sep, None, rest
    return user.group(1), user.group(2), url[user.end() :]


def _redact_url(match: re.Match[str]) -> str:
    scheme, user, rest = split_user_info(match.group(0))
    url = scheme + rest if user is None else f"{scheme}{MASK}@{rest}"
    return _QUERY.sub(lambda m: f"{m.group(1)}={MASK}", url)


def redact(text: str) -> str:
    """``text`` with the credentials of its URLs and its known secret settings masked."""
    text = _URL.sub(_redact_url, text)
    text = _BARE_USERINFO.sub(f"{MASK}@", text)
    text = _ASSIGNED.sub(lambda m: f"{m.group(1)}={MASK}", text)
    return _QUOTED.sub(
        lambda m: f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{m.group(4)}{MASK}{m.group(4)}",
        text,
    )


def redact_value(value: Any) -> Any:
    """``value`` (JSON data: a manifest, a note) with every string passed through
    :func:`redact` and the value of every mapping key named in ``SECRET_KEYS`` masked, at any
    depth; for records written to disk, which outlive the run that held the credentials."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            key: MASK if str(key).lower() in SECRET_KEYS and item else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value]
    return value


class RedactedMessage:
    """A mixin for the project's error bases (before ``Exception`` among the bases): the
    message, as printed or logged (``str``) and in a traceback, has its credentials masked by
    :func:`redact`."""

    def __str__(self) -> str:
        return redact(super().__str__())
