"""torch's own Redis remote caches: the environment that switches them on, and a reachability check.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl
from urllib.parse import unquote_plus
from urllib.parse import urlencode
from urllib.parse import urlsplit
from urllib.parse import urlunsplit

from ._env import REDIS_ENVS
from ._env import REMOTE_SWITCHES
from .options import scheme_of

REDIS_TIMEOUT_S = 2.0  # the start-up PING
# Each of torch's Redis calls (redis-py's defaults: no timeout before 6.x); a URL that sets its own wins.
REDIS_OP_TIMEOUT_S = 5.0


def redis_env(url: str) -> dict[str, str]:
    """Environment for torch's remote FX-graph, AOTAutograd and autotune caches at ``url``.

    ``TORCHINDUCTOR_REDIS_URL`` is read by torch 2.7+; host and port are also set for older releases
    (which cannot select a database or a password). The URL torch gets carries ``socket_timeout`` and
    ``socket_connect_timeout`` (:data:`REDIS_OP_TIMEOUT_S`) unless ``url`` sets them: torch builds its own
    client from it, and a Redis that accepts connections but stops answering would otherwise hold a
    compile forever with redis-py before 6.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = {name for name, _ in query}
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name not in given:
            query.append((name, str(REDIS_OP_TIMEOUT_S)))
    redis_url, host, port = REDIS_ENVS
    return {
        **dict.fromkeys(REMOTE_SWITCHES, "1"),
        redis_url: urlunsplit(parts._replace(query=urlencode(query))),
        host: parts.hostname or "localhost",
        port: str(parts.port or 6379),
    }


def url_options_problem(url: str) -> str | None:
    """What is wrong with the options in ``url``'s query, as redis-py reads them (a value it cannot parse, an
    option no connection takes); None when they are fine. Builds a connection object; connects to nothing."""
    import redis

    try:
        redis.ConnectionPool.from_url(url).make_connection()
    except (TypeError, ValueError) as exc:
        return f"an option redis-py does not take ({' '.join(str(exc).split())[:160]})"
    return None


_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")


def check_redis(url: str) -> str | None:
    """None when Redis answers PING within a couple of seconds, else a short reason: "unreachable (...)" when
    no connection was made or it timed out, "refused: ..." when Redis answered with an error (a wrong
    password, a database index it does not have)."""
    try:
        import redis
    except ImportError:
        return "unreachable (the 'redis' package is not installed: pip install 'pytest-compilecache[redis]')"
    try:
        # The URL's own timeouts are for torch's calls; this check is bounded whatever they say (redis-py lets
        # the URL's options win over these keywords).
        parts = urlsplit(url)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in _TIMEOUTS]
        bounded = urlunsplit(parts._replace(query=urlencode(query)))
        client = redis.Redis.from_url(bounded, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S)
        client.ping()
        client.close()
    except Exception as exc:  # any client error means: no remote cache this session
        why = f"{type(exc).__name__}: {str(exc)[:120]}"
        # AuthenticationError is a ConnectionError to redis-py: Redis answered, and said no.
        lost = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        if isinstance(exc, lost) and not isinstance(exc, redis.exceptions.AuthenticationError):
            return f"unreachable ({why})"
        return f"refused: {why}"
    return None


def redacted(url: str) -> str:
    """The URL without its secrets, for messages (never raises, in time linear in its length: it reports on
    URLs that failed to parse).

    A password reads ``***`` (everything between ``://`` and the last ``@`` before the query, so that one with
    an unescaped ``/`` still does), and so does everything from the first query option whose name, decoded,
    says it is a secret (``password``, ``ssl_password``, ``p%61ssword``, a token); a fragment reads ``#***``.
    Where a password cannot be told from the rest (an ``@`` after a ``?`` or ``#``: in the query, or in a
    password with an unescaped ``?`` or ``#``), and where the host or port does not parse, it reads
    ``<scheme>://***``; a value that does not start with a scheme and ``://`` reads ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme_of(url) != scheme.lower():  # the first :// is not the scheme's (it is in the query)
        return "***"
    hidden = f"{scheme}://***"
    try:
        urlsplit(url).port  # noqa: B018 - raises on a host or port that does not parse
    except ValueError:
        return hidden
    cut = min([i for i in (rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)])
    head, tail = rest[:cut], rest[cut:]
    if "@" in tail:
        return hidden
    at = head.rfind("@")
    if at >= 0 and ":" in head[:at]:
        user = head[:at].split(":", 1)[0]
        head = f"{'***' if '/' in user else user}:***@{head[at + 1 :]}"
    return f"{scheme}://{head}{_shown_query(tail)}"


_SECRET_WORDS = ("pass", "token", "secret")


def _shown_query(tail: str) -> str:
    """``?query#fragment`` with everything from the first option whose decoded name says it is a secret hidden
    (an unescaped ``&``, ``;`` or ``#`` in its value included), and the fragment hidden."""
    query, hashmark, _ = tail.partition("#")
    for option in re.finditer(r"[?&;]([^?&;]*)", query):
        name, equals, _ = option.group(1).partition("=")
        if any(word in unquote_plus(name).lower() for word in _SECRET_WORDS):
            return query[: option.start(1)] + name + equals + "***"
    return query + ("#***" if hashmark else "")
