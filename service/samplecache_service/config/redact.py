"""Credentials never leave the daemon: every URL it prints or serves has its user:password part masked."""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any, Mapping

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s'\"]+)@")
# the same URL percent-encoded, as a request path holds it (uvicorn's access log writes paths so)
_USERINFO_QUOTED = re.compile(r"(?i)(?P<scheme>[a-z][a-z0-9+.\-]*%3A(?://|%2F%2F))"
                              r"(?P<userinfo>(?:(?!%40|%2F)[^/@\s'\"])+)%40")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|"
                           r"token|access_token|key|password)=)[^&\s'\"]+")
MASK = "***"


def redact(text: str) -> str:
    """``text`` with the user:password of any URL in it, and secret query parameters, replaced by ***."""
    if "://" not in text and "=" not in text and "%3A" not in text and "%3a" not in text:
        return text
    text = _USERINFO_QUOTED.sub(lambda m: m.group("scheme") + MASK + "%40", text)
    return _SECRET_QUERY.sub(lambda m: m.group(1) + MASK, _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text))


def shown_id(text: str) -> str:
    """A short stable id of ``text`` (a remote path) that tells nothing of its credentials: a hash of its masked
    form, so a file whose URL holds a password can be named in a request (``DELETE /v1/quarantine/{id}``)."""
    return hashlib.sha256(redact(text).encode()).hexdigest()[:16]


# storage option keys whose values are never secrets (shown by `samplecache config`); every other key is hidden
SHOWN_OPTIONS = frozenset({"endpoint_url", "region_name", "region", "anon", "use_ssl", "verify", "requester_pays",
                           "addressing_style", "signature_version", "project", "account_name", "default_block_size",
                           "version_aware", "use_listings_cache", "listings_expiry_time", "skip_instance_cache"})
OPTION_GROUPS = frozenset({"client_kwargs", "config_kwargs", "s3"})  # nested dicts of options: each key judged
HIDDEN = "<hidden>"


def masked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """fsspec storage options for people: known non-secret values shown (with any URL's credentials masked),
    every other value ``<hidden>``, so an endpoint is visible and an unknown key never leaks."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in OPTION_GROUPS and isinstance(value, Mapping):
            out[key] = masked_options(value)
        elif key in SHOWN_OPTIONS and not isinstance(value, (Mapping, list)):
            out[key] = redact(value) if isinstance(value, str) else value
        else:
            out[key] = HIDDEN
    return out


class RedactingFilter(logging.Filter):
    """A log filter that masks credentials in every record's final message (the daemon's log formatters in
    logfmt.py mask their whole output instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True
