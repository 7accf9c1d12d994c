"""Debian's postfix and dovecot on loopback, each from a private configuration in a
temporary directory, for the tests of the SMTP adapter's Sent-folder search.

Postfix takes SMTP on a free port and hands every message to dovecot over LMTP. A message
whose envelope sender is `SENDER` is also copied to `opledger+Sent@mail.test`
(`sender_bcc_maps`), which dovecot's LMTP files into the `Sent` folder of the mailbox user
`opledger` (`lmtp_save_to_detail_mailbox`): the copy a provider files of what was
submitted, arriving a moment after the 250, as at a real provider. Mail from any other
sender gets no copy. Dovecot serves IMAP on a free port (STARTTLS offered, plaintext login
allowed on loopback) and IMAPS on another, with a throwaway certificate for 127.0.0.1.

Nothing of the machine's own configuration is read or changed: both servers are started
with `-c <private config>`, keep their queue, state and sockets under the temporary
directory, and are stopped by `close`. Postfix's master runs only as root.
"""

from __future__ import annotations

import imaplib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from opledger.adapters.imap import SentFolder
from opledger.dev.processes import listening, wait_until

#: the envelope sender whose messages get a Sent copy
SENDER = "opledger@localhost"  # the SMTP adapter's default sender
#: a sender the server files no copy for (a provider that keeps none of SMTP submissions)
UNRECORDED_SENDER = "nocopy@mail.test"
#: the recipient: a mailbox user of its own, so a test can count what reached them
RECIPIENT = "owner@acme.test"
MAIL_USER = "dovecot"  #: the system user dovecot's processes and mail files run as


def mailservers_available() -> str | None:
    """Why postfix and dovecot cannot be started here (None: they can)."""
    binaries = ("/usr/sbin/postfix", "/usr/sbin/dovecot", "/usr/lib/dovecot/lmtp")
    for binary in (*binaries, "/usr/lib/dovecot/imap"):
        if not os.path.exists(binary):
            return f"{binary} is missing (apt-get install postfix dovecot-imapd dovecot-lmtpd)"
    if os.geteuid() != 0:
        return "postfix's master runs only as root"
    try:
        pwd.getpwnam(MAIL_USER)
    except KeyError:
        return f"no system user {MAIL_USER!r} (installed by dovecot-core)"
    return None


def require_mailservers() -> None:
    """Skip the test when postfix and dovecot are missing: a skip on a laptop, a failure in
    CI (where `.ci/run` installs them)."""
    why = mailservers_available()
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(why)
        pytest.skip(why)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


POSTFIX_MAIN = """\
compatibility_level = 3.6
queue_directory = {root}/spool
data_directory = {root}/data
mail_owner = postfix
setgid_group = postdrop
myhostname = mail.test
mydomain = mail.test
myorigin = mail.test
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject_unauth_destination
alias_maps =
alias_database =
local_transport = error:no local delivery
relay_transport = error:no relaying
default_transport = error:no outside mail
virtual_mailbox_domains = mail.test, acme.test
virtual_mailbox_maps = static:ok
virtual_transport = lmtp:inet:127.0.0.1:{lmtp_port}
recipient_delimiter = +
sender_bcc_maps = inline:{{ {sender}=opledger+Sent@mail.test }}
maillog_file = {root}/postfix.log
maillog_file_prefixes = {root}
smtputf8_enable = no
biff = no
"""

#: every service unchrooted; smtpd only on the test's port
POSTFIX_MASTER = """\
127.0.0.1:{smtp_port} inet n - n - - smtpd
pickup    unix  n - n 60 1 pickup
cleanup   unix  n - n - 0 cleanup
qmgr      unix  n - n 300 1 qmgr
rewrite   unix  - - n - - trivial-rewrite
bounce    unix  - - n - 0 bounce
defer     unix  - - n - 0 bounce
trace     unix  - - n - 0 bounce
verify    unix  - - n - 1 verify
flush     unix  n - n 1000? 0 flush
proxymap  unix  - - n - - proxymap
showq     unix  n - n - - showq
error     unix  - - n - - error
retry     unix  - - n - - error
discard   unix  - - n - - discard
lmtp      unix  - - n - - lmtp
anvil     unix  - - n - 1 anvil
scache    unix  - - n - 1 scache
postlog   unix-dgram n - n - 1 postlogd
"""

DOVECOT_CONF = """\
base_dir = {root}/run
state_dir = {root}/state
instance_name = opledger-test-{imap_port}
listen = 127.0.0.1
protocols = imap lmtp
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
first_valid_uid = {uid}
last_valid_uid = {uid}
log_path = {root}/dovecot.log
ssl = yes
ssl_cert = <{root}/cert.pem
ssl_key = <{root}/key.pem
ssl_dh = </usr/share/dovecot/dh.pem
disable_plaintext_auth = no
auth_mechanisms = plain login
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%n {root}/users
}}
userdb {{
  driver = passwd-file
  args = username_format=%n {root}/users
}}
mail_location = maildir:~/Maildir
recipient_delimiter = +
lmtp_save_to_detail_mailbox = yes
lda_mailbox_autocreate = yes
namespace inbox {{
  inbox = yes
  separator = /
  mailbox Sent {{
    special_use = \\Sent
    auto = create
  }}
  mailbox Archive {{
    auto = create
  }}
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap_port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {imaps_port}
    ssl = yes
  }}
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {lmtp_port}
  }}
}}
"""


class MailServers:
    """Postfix (SMTP on `smtp_port`) and dovecot (IMAP on `imap_port`, IMAPS on
    `imaps_port`) from one temporary directory. Use as a context manager. `postfix_main`:
    more lines for postfix's main.cf (a limit the test wants the server to enforce)."""

    def __init__(self, postfix_main: str = "") -> None:
        self.postfix_main = postfix_main
        self.smtp_port, self.imap_port, self.imaps_port, self.lmtp_port = _free_ports(4)
        self.host = "127.0.0.1"
        self.user = "opledger"
        self.password = secrets.token_urlsafe(12)  # this run's only; never a real one
        self.root = Path(tempfile.mkdtemp(prefix="opledger-mail-"))
        self.root.chmod(0o755)
        self.postfix_dir = self.root / "postfix"
        self.dovecot_dir = self.root / "dovecot"
        self.cafile = str(self.dovecot_dir / "cert.pem")
        self._dovecot: subprocess.Popen[bytes] | None = None
        self._postfix_started = False

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> MailServers:
        try:
            self._start_dovecot()
            self._start_postfix()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_dovecot(self) -> None:
        d = self.dovecot_dir
        for sub in ("run", "state", "home"):
            (d / sub).mkdir(parents=True)
        mail = pwd.getpwnam(MAIL_USER)
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=localhost"),
                *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
                *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                *("-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")),
            ],
            check=True,
            capture_output=True,
        )
        users = "".join(
            f"{name}:{{PLAIN}}{self.password}:{mail.pw_uid}:{mail.pw_gid}::{d}/home/{name}::\n"
            for name in ("opledger", "owner", "other")
        )
        (d / "users").write_text(users)
        (d / "dovecot.conf").write_text(
            DOVECOT_CONF.format(
                root=d,
                user=MAIL_USER,
                group=MAIL_USER,
                uid=mail.pw_uid,
                imap_port=self.imap_port,
                imaps_port=self.imaps_port,
                lmtp_port=self.lmtp_port,
            )
        )
        os.chown(d / "home", mail.pw_uid, mail.pw_gid)
        with (d / "stderr.log").open("wb") as stderr:  # the child keeps its own copy
            self._dovecot = subprocess.Popen(
                ["/usr/sbin/dovecot", "-F", "-c", str(d / "dovecot.conf")],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        wait_until(
            lambda: (
                all(listening(p) for p in (self.imap_port, self.imaps_port, self.lmtp_port))
                or self._dovecot is None
                or self._dovecot.poll() is not None
            ),
            30,
            "dovecot to listen",
        )
        if self._dovecot.poll() is not None:
            raise RuntimeError(f"dovecot exited:\n{self.log('dovecot')}")

    def _postfix(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/usr/sbin/postfix", "-c", str(self.postfix_dir), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def _start_postfix(self) -> None:
        p = self.postfix_dir
        for sub in ("spool", "data"):
            (p / sub).mkdir(parents=True)
        os.chown(p / "data", pwd.getpwnam("postfix").pw_uid, -1)
        (p / "main.cf").write_text(
            POSTFIX_MAIN.format(root=p, lmtp_port=self.lmtp_port, sender=SENDER) + self.postfix_main
        )
        (p / "master.cf").write_text(POSTFIX_MASTER.format(smtp_port=self.smtp_port))
        started = self._postfix("start")
        if started.returncode != 0:
            raise RuntimeError(f"postfix did not start: {started.stderr}\n{self.log('postfix')}")
        self._postfix_started = True
        wait_until(lambda: listening(self.smtp_port), 30, "postfix to listen")

    def close(self) -> None:
        if self._postfix_started:
            if self._postfix("stop").returncode != 0:
                self._postfix("abort")
            pid = self.postfix_dir / "spool" / "pid" / "master.pid"
            wait_until(lambda: not _alive(pid), 15, "postfix's master to exit")
            self._postfix_started = False
        if self._dovecot is not None:
            self._dovecot.terminate()
            try:
                self._dovecot.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self._dovecot.pid, 9)
                self._dovecot.wait()
            self._dovecot = None
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self, which: str) -> str:
        path = (
            self.postfix_dir / "postfix.log"
            if which == "postfix"
            else self.dovecot_dir / "dovecot.log"
        )
        return path.read_text(errors="replace") if path.exists() else ""

    # -- what tests read -----------------------------------------------------------------

    def sent_folder(
        self,
        *,
        folder: str = "Sent",
        tls: str = "starttls",
        user: str | None = None,
        lag: float = 1.0,
        timeout: float = 5.0,
    ) -> SentFolder:
        """The adapter's view of `user`'s `folder` (the mailbox user `opledger` by
        default), over STARTTLS on the IMAP port or on the IMAPS port."""
        port = self.imaps_port if tls == "imaps" else self.imap_port
        return SentFolder(
            host=self.host,
            port=port,
            user=user or self.user,
            password=self.password,
            folder=folder,
            tls=tls,  # type: ignore[arg-type]
            cafile=self.cafile,
            timeout=timeout,
        )

    def copies(self, message_id: str, *, user: str = "opledger", folder: str = "Sent") -> int:
        """How many messages in `user`'s `folder` carry exactly `message_id`: read apart
        from the adapter, with imaplib over the plain port."""
        conn = imaplib.IMAP4(self.host, self.imap_port, timeout=10)
        try:
            conn.login(user, self.password)
            conn.select(f'"{folder}"', readonly=True)
            _, data = conn.uid("SEARCH", "ALL")
            found = 0
            for uid in data[0].split() if data and data[0] else []:
                _, parts = conn.uid("FETCH", uid, "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
                raw = b"".join(p[1] for p in parts if isinstance(p, tuple))
                if raw.split(b":", 1)[-1].strip().decode() == message_id:
                    found += 1
            return found
        finally:
            conn.logout()

    def flags(self, message_id: str, *, user: str = "opledger", folder: str = "Sent") -> str:
        """The IMAP flags of the messages in `user`'s `folder` that carry `message_id`."""
        conn = imaplib.IMAP4(self.host, self.imap_port, timeout=10)
        try:
            conn.login(user, self.password)
            conn.select(f'"{folder}"', readonly=True)
            _, data = conn.uid("SEARCH", "HEADER", "Message-ID", f'"{message_id}"')
            uids = data[0].split() if data and data[0] else []
            shown = [conn.uid("FETCH", uid, "(FLAGS)")[1] for uid in uids]
            return " ".join(str(part) for parts in shown for part in parts)
        finally:
            conn.logout()

    def wait_for_copies(
        self, message_id: str, n: int, *, user: str = "opledger", folder: str = "Sent"
    ) -> None:
        """Wait until `user`'s `folder` holds `n` copies of `message_id` (postfix queues,
        then delivers over LMTP)."""
        try:
            wait_until(lambda: self.copies(message_id, user=user, folder=folder) >= n, 30, "a copy")
        except AssertionError:
            raise AssertionError(
                f"{message_id} not in {user}'s {folder}\n{self.log('postfix')[-3000:]}"
            ) from None


def _alive(pidfile: Path) -> bool:
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def mailservers(postfix_main: str = "") -> Iterator[MailServers]:
    """Postfix and dovecot for the block, after `require_mailservers`."""
    require_mailservers()
    with MailServers(postfix_main) as servers:
        yield servers
