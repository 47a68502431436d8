"""The exporter's optional TLS and basic auth, from a web-config file in Prometheus'
format (``--web.config.file`` of node_exporter and Prometheus itself), so one file serves
every exporter on a node::

    tls_server_config:
      cert_file: /etc/slurmhealth/tls/node.crt
      key_file: /etc/slurmhealth/tls/node.key
      # client_auth_type: RequireAndVerifyClientCert   (with client_ca_file)
      # min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt, e.g. `htpasswd -nBC 10 "" | tr -d ':\\n'`

Supported: ``tls_server_config`` (``cert_file``, ``key_file``, ``client_ca_file``,
``client_auth_type``, ``min_version``, ``max_version``) and ``basic_auth_users`` (bcrypt
hashes). Any other key is refused with its name (as Prometheus' exporter-toolkit reads the
file strictly), never ignored: a typo must not leave an endpoint open. Needs PyYAML and
bcrypt (the ``web`` extra); without them a configured file is a clear error.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.errors import ConfigError

_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version",
             "max_version"}  # fmt: skip
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
             "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}  # fmt: skip
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}  # fmt: skip


@dataclass(frozen=True)
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash


def load(path: str) -> WebConfig:
    """The web config in ``path``; :class:`ConfigError` naming the key that is wrong."""
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise ConfigError(path, None, "metrics.web_config_file needs PyYAML "
                          "(pip install 'slurmhealth[web]')") from None  # fmt: skip
    try:
        with open(path, "rb") as fh:  # root's own file (the config names it)
            doc = yaml.safe_load(fh.read(1 << 20)) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(path, None, str(exc).splitlines()[0]) from None
    if not isinstance(doc, dict):
        raise ConfigError(path, None, "not a mapping")
    unknown = sorted(set(doc) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise ConfigError(
            path, unknown[0], "unknown key (supported: tls_server_config, basic_auth_users)"
        )
    tls = _tls(path, doc.get("tls_server_config"))
    return WebConfig(tls, _users(path, doc.get("basic_auth_users")))


def _tls(path: str, section: Any) -> ssl.SSLContext | None:
    if not section:
        return None
    if not isinstance(section, dict) or set(section) - _TLS_KEYS:
        extra = sorted(set(section) - _TLS_KEYS) if isinstance(section, dict) else ["(type)"]
        raise ConfigError(path, f"tls_server_config.{extra[0]}", "unknown key")
    if not section.get("cert_file") or not section.get("key_file"):
        raise ConfigError(path, "tls_server_config", "needs cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = _VERSIONS[str(section.get("min_version", "TLS12"))]
        if section.get("max_version"):
            ctx.maximum_version = _VERSIONS[str(section["max_version"])]
        ctx.verify_mode = _CLIENT_AUTH[str(section.get("client_auth_type", "NoClientCert"))]
    except KeyError as exc:
        raise ConfigError(path, "tls_server_config", f"unknown value {exc.args[0]!r}") from None
    try:
        ctx.load_cert_chain(str(section["cert_file"]), str(section["key_file"]))
        if section.get("client_ca_file"):
            ctx.load_verify_locations(str(section["client_ca_file"]))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(path, "tls_server_config", str(exc)) from None
    if ctx.verify_mode != ssl.CERT_NONE and not section.get("client_ca_file"):
        raise ConfigError(path, "tls_server_config.client_auth_type", "needs client_ca_file")
    return ctx


def _users(path: str, section: Any) -> dict[str, bytes]:
    if not section:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(path, "basic_auth_users", "not a mapping of user to bcrypt hash")
    try:
        import bcrypt  # noqa: F401  (checked here, used per request)
    except ImportError:
        raise ConfigError(path, "basic_auth_users", "needs bcrypt "
                          "(pip install 'slurmhealth[web]')") from None  # fmt: skip
    out = {}
    for user, hashed in section.items():
        text = str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(path, f"basic_auth_users.{user}", "not a bcrypt hash")
        out[str(user)] = text.encode()
    return out


class BasicAuth:
    """``check(Authorization header)``: True for a listed user with the right password.
    A right answer is remembered (bcrypt costs ~0.1 s a check; exporter-toolkit caches too);
    wrong ones are not, so each costs the guesser a check."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._good: set[tuple[str, bytes]] = set()
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        import bcrypt

        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        key = (user, hashlib.sha256(hashed + b"\0" + password.encode()).digest())
        with self._lock:
            if key in self._good:
                return True
        if not bcrypt.checkpw(password.encode(), hashed.replace(b"$2y$", b"$2b$", 1)):
            return False
        with self._lock:
            if len(self._good) > 1024:
                self._good.clear()
            self._good.add(key)
        return True


def checker(web: WebConfig) -> Callable[[str | None], bool] | None:
    return BasicAuth(web.users).check if web.users else None
