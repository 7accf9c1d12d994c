"""Read a mailbox's Sent folder over IMAP (standard library `imaplib`): the copy a mailbox
provider files of what was submitted over SMTP is the SMTP adapter's only evidence after
a connection lost during DATA.

A read only: the folder is opened with EXAMINE (read-only SELECT) and messages are read
with BODY.PEEK (no \\Seen flag is set). TLS is IMAPS (implicit TLS, port 993) or STARTTLS
(port 143), with the certificate and host name verified; plaintext only to a loopback
address. The password is a `SecretStr`: it is sent in LOGIN and never shown.
"""

from __future__ import annotations

import imaplib
import re
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from email.policy import default as default_policy
from typing import Literal

from pydantic import SecretStr

from opledger.net import folder_problem, imap_credential_problem, is_loopback
from opledger.settings import Settings

#: how the IMAP connection is protected: implicit TLS, STARTTLS, or none (loopback only)
ImapTls = Literal["imaps", "starttls", "none"]

#: the header an SMTP message carries with the sha256 digest of its frozen payload
DIGEST_HEADER = "X-Opledger-Payload-Digest"

#: what one search reads of each message it finds
_FIELDS = f"(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID TO DATE {DIGEST_HEADER.upper()})])"


def quoted(text: str) -> str:
    """`text` as an IMAP quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Copy:
    """One message found in the folder: its UID and the headers we read."""

    uid: str
    message_id: str
    to: str
    date: str
    digest: str | None


@dataclass(frozen=True)
class SentFolder:
    """Where the Sent copies are: one IMAP mailbox's folder, and how to reach it."""

    host: str
    user: str
    password: SecretStr | str = field(repr=False)
    port: int | None = None
    folder: str = "Sent"
    tls: ImapTls = "imaps"
    #: a CA bundle to verify the server with (a private CA); unset: the system's
    cafile: str | None = None
    #: seconds for connecting and for each reply
    timeout: float = 10.0

    @classmethod
    def of(cls, settings: Settings, *, timeout: float) -> SentFolder | None:
        """The Sent folder `OPLEDGER_SMTP_SENT_IMAP_*` name, or None when no host is set."""
        if not settings.smtp_sent_imap_host:
            return None
        assert settings.smtp_sent_imap_user and settings.smtp_sent_imap_password  # validated
        return cls(
            host=settings.smtp_sent_imap_host,
            port=settings.smtp_sent_imap_port,
            user=settings.smtp_sent_imap_user,
            password=settings.smtp_sent_imap_password,
            folder=settings.smtp_sent_folder,
            tls=settings.smtp_sent_imap_tls,
            cafile=settings.smtp_sent_imap_cafile,
            timeout=timeout,
        )

    def __post_init__(self) -> None:
        if self.tls == "none" and not is_loopback(self.host):
            raise ValueError(
                f"IMAP without TLS only to a loopback address, not {self.host!r}: "
                "use imaps or starttls"
            )
        why = folder_problem(self.folder)
        if why is not None:
            raise ValueError(why)
        for what, value in (("user name", self.user), ("password", self._secret())):
            problem = imap_credential_problem(value)
            if problem is not None:
                raise ValueError(f"the IMAP {what} cannot be sent: {problem}")

    @property
    def server(self) -> str:
        """host:port, as a reviewer would look it up."""
        return f"{self.host}:{self.effective_port}"

    @property
    def effective_port(self) -> int:
        return self.port or (993 if self.tls == "imaps" else 143)

    def describe(self) -> str:
        """What is searched, in words (no password)."""
        return f"the folder {self.folder!r} of {self.user} at imap {self.server} ({self.tls})"

    def _secret(self) -> str:
        return (
            self.password.get_secret_value()
            if isinstance(self.password, SecretStr)
            else self.password
        )

    def _connect(self) -> imaplib.IMAP4:
        context = ssl.create_default_context(cafile=self.cafile)
        if self.tls == "imaps":
            return imaplib.IMAP4_SSL(
                self.host, self.effective_port, ssl_context=context, timeout=self.timeout
            )
        conn = imaplib.IMAP4(self.host, self.effective_port, timeout=self.timeout)
        if self.tls == "starttls":
            try:
                conn.starttls(ssl_context=context)
            except BaseException:
                conn.shutdown()
                raise
        return conn

    @contextmanager
    def _examined(self) -> Iterator[tuple[imaplib.IMAP4, int]]:
        """Logged in, the folder open read-only (EXAMINE): the connection and how many
        messages the folder holds; logged out after."""
        conn = self._connect()
        try:
            conn.login(quoted(self.user), self._secret())  # imaplib quotes only the password
            typ, data = conn.select(quoted(self.folder), readonly=True)
            if typ != "OK":
                raise imaplib.IMAP4.error(f"EXAMINE {self.folder!r} refused: {_text(data)}")
            yield conn, int(data[0]) if data and isinstance(data[0], bytes) else 0
        finally:
            _logout(conn)

    def examine(self) -> int:
        """Log in and open the folder read-only: how many messages it holds. Raises as
        `search` does (what `opledger check` reports)."""
        with self._examined() as (_, count):
            return count

    def search(self, message_id: str) -> list[Copy]:
        """The messages in the folder whose Message-ID is exactly `message_id`.

        Raises whatever the connection, TLS, login or a command raises (`imaplib.IMAP4.error`
        for a refusal): the caller maps it. IMAP's HEADER search matches substrings, so
        every hit's Message-ID is read back and compared whole.
        """
        with self._examined() as (conn, _):
            typ, data = conn.uid("SEARCH", "HEADER", "Message-ID", quoted(message_id))
            if typ != "OK":
                raise imaplib.IMAP4.error(f"SEARCH refused: {_text(data)}")
            uids = data[0].split() if data and isinstance(data[0], bytes) else []
            copies = []
            for uid in uids:
                typ, parts = conn.uid("FETCH", uid.decode(), _FIELDS)
                if typ != "OK":
                    raise imaplib.IMAP4.error(f"FETCH {uid!r} refused: {_text(parts)}")
                raw = b"".join(p[1] for p in parts if isinstance(p, tuple))
                copy = _copy(uid.decode(), raw)
                if copy.message_id == message_id:
                    copies.append(copy)
            return copies


def _logout(conn: imaplib.IMAP4) -> None:
    try:
        conn.logout()
    except Exception:
        conn.shutdown()


_ANGLE = re.compile(r"<[^<>\s]+>")


def _copy(uid: str, raw: bytes) -> Copy:
    headers = BytesHeaderParser(policy=default_policy).parsebytes(raw)
    found = _ANGLE.search(str(headers.get("Message-ID", "")))
    digest = headers.get(DIGEST_HEADER)
    return Copy(
        uid=uid,
        message_id=found.group(0) if found else "",
        to=str(headers.get("To", "")),
        date=str(headers.get("Date", "")),
        digest=str(digest).strip() if digest is not None else None,
    )


def _text(data: object) -> str:
    if isinstance(data, list) and data and isinstance(data[0], bytes):
        return data[0].decode(errors="replace")[:200]
    return str(data)[:200]
