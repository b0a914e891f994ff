"""Make command lines, environments and free text safe to paste into a ticket.

Redacted: values of options and variables named like a secret (``*_TOKEN``, ``*_KEY``, ``*SECRET*``,
``*PASSWORD*``, auth/credential/cookie names), passwords and tokens in URLs (``https://user:pw@host``,
``?token=...``), ``Authorization: Bearer ...`` headers, and well-known token shapes (GitHub, Hugging Face,
OpenAI, AWS access keys, Slack, GitLab, JWTs) wherever they appear.  A report never includes a whole
environment: `redact_env` is for the few variables a report chooses to show.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence

REDACTED = "[REDACTED]"

# A name (option or variable, normalised to UPPER_SNAKE) that holds a secret.
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|TOKENS|KEY|KEYS|APIKEY|PASS|PASSWD|PASSPHRASE|AUTH|AUTHORIZATION|CREDENTIAL|CREDENTIALS|COOKIE|PAT|DSN)(?:$|_)"
    r"|SECRET|PASSWORD"
)

# Well-known token shapes, redacted wherever they appear.
_TOKEN_SHAPES = re.compile(
    r"\b(?:"
    r"gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI-style
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    r")"
)
# scheme://user:password@host  and  scheme://token@host
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]+)(?::(?P<pw>[^/\s@]*))?@")
# ?token=...&api_key=...
_URL_QUERY = re.compile(
    r"(?P<key>[?&;][^=&;\s#]*(?:token|key|secret|password|passwd|signature|sig|auth|credential)[^=&;\s#]*=)[^&;\s#]+",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
# NAME=value and --name=value / --name value inside free text
_ASSIGNMENT = re.compile(
    r"(?P<name>(?<![\w-])-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>=|\s+)(?P<value>\"[^\"]*\"|'[^']*'|[^\s\"']+)"
)


def _normalise(name: str) -> str:
    return re.sub(r"[-.]", "_", name.lstrip("-")).upper()


def is_secret_name(name: str) -> bool:
    """True for option or variable names that hold secrets: HF_TOKEN, --api-key, DB_PASSWORD, AWS_SECRET..."""
    return bool(name) and bool(_SECRET_NAME.search(_normalise(name)))


def _url_userinfo(m: re.Match[str]) -> str:
    if m.group("pw") is not None:
        return f"{m.group('scheme')}{m.group('user')}:{REDACTED}@"
    return f"{m.group('scheme')}{REDACTED}@"  # a lone user part is usually a token (https://TOKEN@github.com)


def redact_value(value: str) -> str:
    """Secrets inside one value: URL credentials, secret query parameters, bearer tokens, token shapes."""
    value = _URL_USERINFO.sub(_url_userinfo, value)
    value = _URL_QUERY.sub(lambda m: m.group("key") + REDACTED, value)
    value = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", value)
    return _TOKEN_SHAPES.sub(REDACTED, value)


def redact_text(text: str) -> str:
    """Free text (a shell command in one string, a report): values after secret names, then `redact_value`."""

    def assignment(m: re.Match[str]) -> str:
        name, sep = m.group("name"), m.group("sep")
        whole: str = m.group(0)
        if sep.strip() == "" and not name.startswith("-"):
            return whole  # "word word": only options take a space-separated value
        if is_secret_name(name) and m.group("value") != REDACTED:
            return f"{name}{sep}{REDACTED}"
        return whole

    return redact_value(_ASSIGNMENT.sub(assignment, text))


def redact_cmdline(argv: Sequence[str]) -> tuple[str, ...]:
    """A process's argv with secrets replaced: `--api-key=X`, `--token X`, `HF_TOKEN=X`, URL credentials."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next:
            redact_next = False
            out.append(REDACTED)
            continue
        if arg.startswith("-") and "=" in arg:
            name, value = arg.split("=", 1)
            out.append(f"{name}={REDACTED}" if is_secret_name(name) else f"{name}={redact_value(value)}")
        elif arg.startswith("-") and len(arg) > 1 and is_secret_name(arg):
            out.append(arg)
            redact_next = True
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", arg):
            name, value = arg.split("=", 1)
            out.append(f"{name}={REDACTED}" if is_secret_name(name) else f"{name}={redact_value(value)}")
        elif " " in arg:
            out.append(redact_text(arg))  # `bash -c "..."`: a whole command in one argument
        else:
            out.append(redact_value(arg))
    return tuple(out)


def redact_env(env: Mapping[str, str], only: Optional[Iterable[str]] = None) -> dict[str, str]:
    """Environment variables with secret values replaced; with `only`, just those names (a report's pick)."""
    names = list(env) if only is None else [n for n in only if n in env]
    return {n: (REDACTED if is_secret_name(n) else redact_value(str(env[n]))) for n in names}


def redact_jsonable(value: Any) -> Any:
    """Every string in a JSON-ready structure through `redact_text` (the report's last safety net)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [redact_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_jsonable(v) for k, v in value.items()}
    return value
