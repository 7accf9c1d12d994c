"""Checks on what the settings name before anything connects: loopback hosts, credentials
that can travel in a header or an IMAP command, mailbox folder names.

No check here ever repeats the value it refuses: a credential's problem is said without
the credential.
"""

from __future__ import annotations

import ipaddress
import re


def is_loopback(host: str) -> bool:
    """`localhost`, or an address on the loopback network (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: what an API secret key is made of (Stripe's `sk_test_...`, most providers' tokens)
_API_KEY = re.compile(r"[A-Za-z0-9_\-]+")


def api_key_problem(key: str) -> str | None:
    """Why `key` cannot be an API secret key (None: it can). A trailing line break from how
    a secret was written into the environment is the usual one."""
    if not key:
        return "it is empty"
    if _API_KEY.fullmatch(key) is None:
        return (
            "it holds whitespace, a line break or another character no key has (check how "
            "it was written into the environment)"
        )
    return None


def imap_credential_problem(value: str) -> str | None:
    """Why `value` cannot be sent as an IMAP user name or password (None: it can)."""
    if not value:
        return "it is empty"
    if not value.isascii() or not value.isprintable():
        return "it must be printable ASCII (no line breaks, no other characters)"
    return None


def folder_problem(folder: str) -> str | None:
    """Why `folder` cannot be named to IMAP as given (None: it can)."""
    if not folder.strip():
        return "the folder name is empty"
    if not folder.isascii() or any(c in folder for c in "\r\n\0"):
        # non-ASCII names travel as modified UTF-7 (RFC 3501 5.1.3), which this does not do
        return "the folder name must be ASCII without line breaks (write it as IMAP lists it)"
    return None
