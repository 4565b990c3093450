"""Credentials never leave the daemon: every URL it prints or serves has its user:password part masked."""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s'\"]+)@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|"
                           r"token|access_token|key|password)=)[^&\s'\"]+")
MASK = "***"


def redact(text: str) -> str:
    """``text`` with the user:password of any URL in it, and secret query parameters, replaced by ***."""
    if "://" not in text and "=" not in text:
        return text
    return _SECRET_QUERY.sub(lambda m: m.group(1) + MASK, _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text))


class RedactingFilter(logging.Filter):
    """A log filter that masks credentials in every record's final message (the daemon's log formatters in
    logfmt.py mask their whole output instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True
