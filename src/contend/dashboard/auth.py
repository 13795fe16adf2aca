"""Who may look and who may act: the dashboard's token, its cookie and the CSRF check.

* **Binding.** The dashboard listens on 127.0.0.1 unless told otherwise, and refuses any other
  address unless a token is set (``--token`` or ``CONTEND_DASHBOARD_TOKEN``): see
  :func:`check_bind`.
* **The token.** With a token set, every page and the metrics ask for it: a browser gets a
  form, and once the right token is posted, a cookie (``HttpOnly``, ``SameSite=Strict``)
  holding an HMAC of the token under a secret of this process, never the token itself; a
  scraper or script sends ``Authorization: Bearer TOKEN``. A wrong token is refused with 403.
* **Actions** (retry, cancel) are POSTs only, and each form carries a CSRF token: an HMAC of
  the caller's cookie (or of "anonymous" on a dashboard without a token) under the process's
  secret. Another site can make a browser send a POST, but it cannot read a page of ours to
  learn the token, so its forged POST is refused. A POST whose ``Origin`` header names another
  host is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from contend.errors import ConfigError

COOKIE = "contend_dashboard"
ENV_TOKEN = "CONTEND_DASHBOARD_TOKEN"  # noqa: S105 - the name of a variable


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on an address other than loopback without a token."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"the dashboard would be open to anyone who reaches {host}: give --token TOKEN "
            f"(or set {ENV_TOKEN}), or bind to 127.0.0.1"
        )
    if token is not None and len(token) < 8:
        raise ConfigError("a dashboard token must have at least 8 characters")


@dataclass
class Guard:
    """The token (None: none asked), and the secret this process signs with."""

    token: str | None = None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def _sign(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    @property
    def required(self) -> bool:
        return self.token is not None

    def right_token(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def cookie_value(self) -> str:
        """What the cookie holds once the right token was given."""
        assert self.token is not None
        return self._sign("cookie:" + self.token)

    def allowed(self, cookie: str | None, authorization: str | None) -> bool:
        """May this request look? Always, without a token; else the cookie or a bearer token."""
        if self.token is None:
            return True
        if cookie and hmac.compare_digest(cookie, self.cookie_value()):
            return True
        scheme, _, given = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and self.right_token(given.strip())

    def csrf(self, cookie: str | None) -> str:
        """The CSRF token the forms of this caller carry."""
        return self._sign("csrf:" + (cookie or "anonymous"))

    def csrf_ok(self, cookie: str | None, given: str | None, origin: str | None, host: str) -> bool:
        if origin and urlsplit(origin).netloc != host:  # "null" too: a sandboxed frame
            return False
        return bool(given) and hmac.compare_digest(given or "", self.csrf(cookie))
