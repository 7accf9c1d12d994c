"""The SMTP adapter: `email.smtp_send.v1` with smtplib.

SMTP has no deduplication: a 250 after DATA is custody (accepted), and a connection lost
after DATA leaves the send ambiguous. The Message-ID is deterministic (derived from the
operation's marker, its first key: the same for the act asked again after the ledger lost
its record) and the message carries the digest of its frozen payload
(`X-Opledger-Payload-Digest`), but no server dedupes on either.

Where the mailbox provider files a copy of what was submitted in a Sent folder (most
hosted mailboxes do), the adapter can be given that folder (`SentFolder`, over IMAP): its
lookup then searches it for our Message-ID, and a copy found is evidence the message was
accepted (custody, never delivery). Absence proves nothing (the copy lags, or the
provider files none), so an ambiguous send that no copy explains still goes to review,
after the declared search lag. Without a Sent folder there is no lookup at all.
"""

from __future__ import annotations

import re
import smtplib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any, ClassVar

from opledger.ledger import (
    Ambiguous,
    Attempt,
    Binding,
    Claim,
    Confirmed,
    Operation,
    Outcome,
    Rejected,
)

from .base import (
    CONFIRMED,
    INCONCLUSIVE,
    NOT_SENT,
    THROTTLED,
    Contract,
    Idempotency,
    Limits,
    Lookup,
    LookupResult,
    unreached,
)
from .email import EMAIL_SCHEMA
from .imap import DIGEST_HEADER, SentFolder

ACTIONS: tuple[str, ...] = ("email.smtp_send.v1",)


def smtp_contract(
    *,
    request_timeout: timedelta = timedelta(seconds=30),
    max_in_flight: timedelta | None = None,
    sent_search_lag: timedelta | None = None,
    lookup_interval: timedelta = timedelta(seconds=5),
    limits: Limits | None = None,
) -> Contract:
    """SMTP's contract. The in-flight bound defaults to RFC 5321's 10-minute wait for the
    reply to DATA; a relay you run yourself may promise less.

    A server's "not now" (`smtp_not_now`) is a 4yz reply: by RFC 5321 §4.2.1 the server
    took nothing, so it applies nothing. SMTP names no wait, so the provider is left alone
    for `limits.retry_after_default`: a minute unless `limits` says otherwise (a relay's
    connection and rate limits count over a minute, as Postfix's anvil does).

    `sent_search_lag`: the adapter searches a Sent folder (`SentFolder`), whose copy of a
    message may appear this long after the send's in-flight deadline; the lookup is then a
    search (eventually consistent: absence proves nothing). None: no lookup."""
    source = "RFC 5321 §4.1.1.4, §4.5.3.2.6 (250 after DATA is custody; 10-minute DATA timeout)"
    lookup = Lookup(kind="none")
    if sent_search_lag is not None:
        lookup = Lookup(kind="search", lag=sent_search_lag, interval=lookup_interval)
        source += "; the mailbox provider's Sent copy, searched over IMAP (RFC 3501 SEARCH HEADER)"
    return Contract(
        provider="smtp",
        effect="email",
        idempotency=Idempotency(kind="none"),
        lookup=lookup,
        success_proves="accepted",
        request_timeout=request_timeout,
        max_in_flight=max_in_flight or max(request_timeout, timedelta(minutes=10)),
        limits=(limits or Limits(retry_after_default=timedelta(minutes=1))).model_copy(
            update={"throttle_applies_nothing": True}
        ),
        source=source,
    )


#: RFC 3463 enhanced status codes that speak of the server rather than the message: 4.3.x
#: (the mail system: not accepting messages, out of resources), 4.4.5 (system congestion)
#: and 4.7.x (security and policy: rate limits, too many connections, greylisting)
_SERVER_BUSY = re.compile(r"4\.(3\.\d{1,3}|4\.5|7\.\d{1,3})(?!\d)")
#: reply codes that say so by themselves: 421, the service is not available (RFC 5321
#: §3.8, §4.2.3), and 454, a temporary failure of the server's own (TLS, authentication;
#: Amazon SES answers its sending-rate limit with it)
_NOT_NOW_CODES = frozenset({421, 454})


def smtp_not_now(code: int, reply: bytes | str) -> Ambiguous | None:
    """An SMTP server's "not now" as a THROTTLED outcome, or None when the reply is none.

    "Not now" is a 421 or a 454, or any 4yz reply whose enhanced status code (RFC 3463) is
    4.3.x, 4.4.5 or 4.7.x: the server, not this message, refuses for the moment. Other 4yz
    replies (a full mailbox, 4.2.2; a busy one) refuse this message for now, and rule 13
    bounds how often it is tried again. Nothing was accepted either way (RFC 5321 §4.2.1).
    SMTP has no Retry-After: the wait is the contract's `Limits.retry_after_default`.
    """
    if not 400 <= code < 500:
        return None
    text = (reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply).strip()
    enhanced = _SERVER_BUSY.match(text)
    if code not in _NOT_NOW_CODES and enhanced is None:
        return None
    return Ambiguous(
        code=THROTTLED,
        reason=f"the SMTP server said not now: {code} {text}"[:500],
        detail={"smtp_code": code, "replayed": False, "retry_after_s": None},
    )


def message_id_for(operation: Operation) -> str:
    return f"<{operation.marker}@opledger>"


def outcome_for_smtp_error(exc: Exception, *, message_sent: bool = True) -> Outcome:
    """Map anything smtplib or the socket can raise to an outcome.

    `message_sent`: whether the message's content may have left us (the failure came during
    or after DATA). Before that, nothing can have been accepted, so an error that is not a
    permanent refusal is recorded as not sent; a temporary (4xx) refusal means the server
    did not take custody either way.
    """
    text = f"{type(exc).__name__}: {exc}"[:500]
    replies = _replies(exc)
    for code, reply in replies:
        not_now = smtp_not_now(code, reply)
        if not_now is not None:
            return not_now
    if isinstance(exc, smtplib.SMTPRecipientsRefused | smtplib.SMTPSenderRefused):
        codes = [c for c, _ in replies]
        if all(500 <= c < 600 for c in codes):
            return Rejected(code="smtp_refused", reason=str(exc)[:500], detail={"codes": codes})
        return Ambiguous(
            code=NOT_SENT, reason=f"temporary refusal: {text}", detail={"codes": codes}
        )
    if isinstance(exc, smtplib.SMTPResponseException):
        if 500 <= exc.smtp_code < 600:
            return Rejected(
                code="smtp_refused", reason=str(exc)[:500], detail={"code": exc.smtp_code}
            )
        if 400 <= exc.smtp_code < 500:  # the transaction failed: no custody was taken
            return Ambiguous(
                code=NOT_SENT, reason=f"temporary refusal: {text}", detail={"code": exc.smtp_code}
            )
    if not message_sent:
        return Ambiguous(code=NOT_SENT, reason=f"before the message was sent: {text}")
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return Ambiguous(code="connection_lost", reason=text)
    if isinstance(exc, TimeoutError):
        return Ambiguous(code="timeout", reason=text)
    if isinstance(exc, smtplib.SMTPException | OSError):
        return Ambiguous(code="connection_lost", reason=text)
    return Ambiguous(code="client_error", reason=text)


def _replies(exc: Exception) -> list[tuple[int, bytes | str]]:
    """The server's replies an smtplib exception carries (code, text), if any."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return list(exc.recipients.values())
    if isinstance(exc, smtplib.SMTPResponseException):  # SMTPSenderRefused among them
        return [(exc.smtp_code, exc.smtp_error)]
    return []


def outcome_for_smtp_connect_error(exc: Exception) -> Outcome:
    """Map a failure to open the SMTP session: nothing was sent either way.

    A socket error (refused, unreachable, no such host, a timeout or a TLS failure while
    connecting) means the server never took the connection: `detail["why"]` says so
    (NO_CONNECTION), as for HTTP. smtplib turns anything after the connection was made (a
    4xx or 5xx greeting, a connection closed or silent before its greeting) into an
    `SMTPException`, which is mapped as before.
    """
    if isinstance(exc, OSError) and not isinstance(exc, smtplib.SMTPException):
        return unreached(f"no connection, nothing sent: {type(exc).__name__}: {exc}")
    return outcome_for_smtp_error(exc, message_sent=False)


class SmtpAdapter:
    actions = ACTIONS
    payload_schemas: ClassVar[Mapping[str, Mapping[str, Any]]] = {ACTIONS[0]: EMAIL_SCHEMA}
    descriptions: ClassVar[Mapping[str, str]] = {
        ACTIONS[0]: "Send one email over SMTP; the target is the recipient."
    }

    def __init__(
        self,
        host: str,
        port: int,
        *,
        sender: str = "opledger@localhost",
        contract: Contract | None = None,
        sent: SentFolder | None = None,
    ) -> None:
        """`sent`: the Sent folder of the mailbox `sender` submits as, where the provider
        files a copy of each message; the contract must then declare a search lookup
        (`smtp_contract(sent_search_lag=...)`), and without one, no lookup."""
        self.host, self.port, self.sender = host, port, sender
        self.contract = contract or smtp_contract()
        self.sent = sent
        searches = self.contract.lookup.kind == "search"
        if searches != (sent is not None):
            raise ValueError(
                "an SMTP contract declares a search lookup exactly when a Sent folder is "
                "given: smtp_contract(sent_search_lag=...) with sent=SentFolder(...)"
            )

    def dispatch(self, claim: Claim) -> Outcome:
        payload = claim.payload
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = str(payload.get("to", ""))
        message["Subject"] = str(payload.get("subject", ""))
        message["Message-ID"] = message_id_for(claim.operation)
        # a copy found later binds this body, not only this id
        message[DIGEST_HEADER] = claim.operation.payload_digest
        message.set_content(str(payload.get("text", "")))
        ids = {"message_id": message_id_for(claim.operation)}
        outcome = self._send(claim, message)
        return outcome.model_copy(update={"detail": {**outcome.detail, **ids}})

    def _send(self, claim: Claim, message: EmailMessage) -> Outcome:
        """One SMTP transaction: the envelope first (nothing of the message has left while
        it is refused or cut), then DATA (after which a lost connection is ambiguous)."""
        try:
            smtp = smtplib.SMTP(
                self.host, self.port, timeout=self.contract.request_timeout.total_seconds()
            )
        except Exception as exc:  # no connection: nothing was sent
            return outcome_for_smtp_connect_error(exc)
        try:
            try:
                smtp.ehlo_or_helo_if_needed()
                code, reply = smtp.mail(self.sender)
                if code != 250:
                    raise smtplib.SMTPSenderRefused(code, reply, self.sender)
                to = str(message["To"])
                code, reply = smtp.rcpt(to)
                if code not in (250, 251):
                    raise smtplib.SMTPRecipientsRefused({to: (code, reply)})
                # the claim's send-by window, checked right before the message leaves: a
                # refusal here sends no DATA, so nothing can have been accepted
                claim.window.check()
            except Exception as exc:
                return outcome_for_smtp_error(exc, message_sent=False)
            try:
                # smtplib raises only when DATA itself is refused; the reply to the
                # message body comes back as a return value
                code, reply = smtp.data(message.as_bytes())
                if code != 250:
                    raise smtplib.SMTPDataError(code, reply)
            except Exception as exc:
                return outcome_for_smtp_error(exc, message_sent=True)
        finally:
            try:
                smtp.quit()  # custody was taken (or not) before this: its failure changes nothing
            except Exception:
                smtp.close()
        return Confirmed(
            receipt_id=str(message["Message-ID"]),
            binding=Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target),
            accepted_only=True,
            result={"message_id": str(message["Message-ID"])},
        )

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        """Search the Sent folder for our Message-ID (a read; never raises). Without a Sent
        folder there is nothing to ask."""
        if self.sent is None:
            return LookupResult(verdict=INCONCLUSIVE, detail={"reason": "SMTP offers no lookup"})
        sent, message_id = self.sent, message_id_for(operation)
        searched = {
            "source": "imap_sent_search",
            "server": sent.server,
            "tls": sent.tls,
            "user": sent.user,
            "folder": sent.folder,
            "message_id": message_id,
            "searched_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        where = f"{sent.describe()} for Message-ID {message_id}"
        what = f"searched {where}"
        try:
            copies = sent.search(message_id)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            return LookupResult(
                verdict=INCONCLUSIVE,
                # the summary first: `opledger review show` cuts a long detail short
                detail={
                    "summary": f"could not search {where} at {searched['searched_at']}: {error}",
                    **searched,
                    "error": error,
                },
            )
        ours = [c for c in copies if c.digest in (None, operation.payload_digest)]
        found = {
            "hits": len(copies),
            "copies": [
                {"uid": c.uid, "date": c.date, "to": c.to, "payload_digest": c.digest}
                for c in copies
            ],
        }
        if not ours:
            summary = (
                f"{what} at {searched['searched_at']}: not found (a copy may lag, or the "
                "provider files none: absence proves nothing)"
                if not copies
                else f"{what} at {searched['searched_at']}: {len(copies)} copies, none with "
                "this operation's payload digest"
            )
            return LookupResult(
                verdict=INCONCLUSIVE, detail={"summary": summary, **searched, **found}
            )
        digested = any(c.digest is not None for c in ours)
        return LookupResult(
            verdict=CONFIRMED,
            binding=Binding(
                idempotency_key=operation.idempotency_key,
                receipt_id=message_id,
                target=operation.target,
                payload_digest=operation.payload_digest if digested else None,
            ),
            detail={
                "summary": f"{what} at {searched['searched_at']}: found {len(ours)} (the "
                "provider accepted it: custody, not delivery)",
                **searched,
                **found,
                "accepted_only": True,
                "receipt_id": message_id,
            },
            result={"message_id": message_id},
        )

    def search_hint(self, operation: Operation) -> str:
        """What a person can search for to learn whether the message went out."""
        by_hand = (
            f"Search the receiving mail server's log, or the recipient's mailbox, for "
            f"Message-ID {message_id_for(operation)}"
        )
        if self.sent is None:
            return by_hand
        return (
            f"opledger searched {self.sent.describe()} for Message-ID "
            f"{message_id_for(operation)} (the evidence says when, and what it found); a "
            f"copy may appear late, or not at all for a provider that files none. {by_hand}"
        )
