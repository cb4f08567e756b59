"""Validation of topic and group names.

Names become directory names on disk (``consumequeue/<topic>/<queue>``) and travel in every
record, so the alphabet is strict: ASCII letters, digits, ``_ . -`` and, for broker-internal
topics only, a leading ``%`` (``%HALF``, ``%RETRY%group``, ``%DLQ%group``).
"""

from __future__ import annotations

import re
from typing import Final

from txbroker.errors import InvalidName

__all__ = ["MAX_NAME_BYTES", "SYSTEM_PREFIX", "validate_topic"]

# 127 bytes: well inside every file system's 255-byte file-name limit (names become directory
# names); RocketMQ uses the same bound for topic names.
MAX_NAME_BYTES: Final = 127
SYSTEM_PREFIX: Final = "%"

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,126}")
_SYSTEM = re.compile(r"%[A-Za-z0-9_.\-%]{1,126}")

# Validation runs on every append; names repeat, so remember the good ones (bounded).
_valid_cache: set[str] = set()
_VALID_CACHE_MAX: Final = 65_536


def validate_topic(topic: str, *, allow_system: bool = True) -> str:
    """Return ``topic`` unchanged if it is a legal name, else raise :class:`InvalidName`."""
    if topic in _valid_cache:
        if not allow_system and topic.startswith(SYSTEM_PREFIX):
            raise InvalidName(f"topic {topic!r} is reserved for the broker (leading '%')")
        return topic
    if not isinstance(topic, str):
        raise InvalidName(f"topic must be a string, not {type(topic).__name__}")
    if topic.startswith(SYSTEM_PREFIX):
        if not allow_system:
            raise InvalidName(f"topic {topic!r} is reserved for the broker (leading '%')")
        ok = _SYSTEM.fullmatch(topic) is not None
    else:
        ok = _USER.fullmatch(topic) is not None
    if not ok:
        raise InvalidName(
            f"invalid topic name {topic!r}: use 1-{MAX_NAME_BYTES} characters from "
            "A-Z a-z 0-9 _ . - (not starting with '.' or '-')"
        )
    if len(_valid_cache) < _VALID_CACHE_MAX:
        _valid_cache.add(topic)
    return topic
