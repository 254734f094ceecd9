"""Values a source holds under secret-looking keys (an API key, a token, a password): the import never copies them.

    data = hide(data)                 # every value under such a key, at any depth, now reads HIDDEN
    secret_looking("wandb.api_key")   # True: a part of the dotted path names a secret

The importer reads a source (and every file it follows) only through its hidden copy (Draft), so no report line, note,
spec value or error message can quote a secret, whichever code path builds it. The keys stay: a secret-looking key is
named like any other, and vetted like any other (a key its tool refuses is still refused). A false positive (a
tokenizer's pad_token, Megatron's apply_query_key_layer_scaling) costs nothing: no importer reads such a key, and no
line shows the value of a key the importer does not read.
"""

from __future__ import annotations

import re
from typing import Any


class Hidden(str):
    """What a value under a secret-looking key reads as: a string, so every f-string, str(), int() error, TOML and
    JSON writer shows the same few characters and no secret."""

    __slots__ = ()


HIDDEN = Hidden("<hidden>")

WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
"""A key's words: snake_case, kebab-case, camelCase and SHOUTING_CASE split alike (apiKey, API_KEY, api-key: api, key)."""

SECRET_WORDS = frozenset({"secret", "secrets", "password", "passwd", "passphrase", "credential", "credentials", "creds", "apikey",
                          "oauth", "authorization", "authentication"})
"""Words that name a secret wherever they stand (aws_secret_access_key, tracking_password, gcp_credentials)."""

SECRET_PARTS = ("secret", "passw", "credential", "apikey", "accesskey", "privatekey")
"""Parts of a glued word that name a secret (clientsecret, mlflowpassword, awsaccesskey)."""

LAST_WORDS = frozenset({"key", "token", "auth"})
"""Words that name a secret as a key's last word (api_key, hf_token, hf_use_auth_token, auth), not inside one: attention's
linear_key_head_dim, apply_query_key_layer_scaling and Megatron's moe_token_dispatcher_type are no secrets."""

BEFORE_KEY = frozenset({"api", "access", "private", "session", "auth", "secret"})
"""Words that make `key` / `token` a secret anywhere in the name (aws_access_key_id, auth_token_file)."""

TEXT_TOKENS = frozenset({"pad", "bos", "eos", "unk", "sep", "cls", "mask", "eot", "eod", "boi", "eoi", "start", "end"})
"""A tokenizer's special tokens: pad_token is a piece of text, not a secret."""

ASSIGNMENT = re.compile(r"^(\s*-{0,2}([A-Za-z_][A-Za-z0-9_.-]*)\s*=)")
"""A string that sets a variable or an argument: `HF_TOKEN=...`, `--api-key=...` (an env list, launcher arguments)."""


def secret_looking(key: str) -> bool:
    """Whether a key (or any part of a dotted path) names a secret."""
    return any(_secret_name(part) for part in str(key).split("."))


def _secret_name(name: str) -> bool:
    words = [w.lower() for w in WORDS.findall(name)]
    if any(w in SECRET_WORDS or any(part in w for part in SECRET_PARTS) for w in words):
        return True
    if any(a in BEFORE_KEY and b in ("key", "token") for a, b in zip(words, words[1:])):
        return True
    if not words:
        return False
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    return (last in LAST_WORDS or (last.endswith("token") and last != "token")) and before not in TEXT_TOKENS


def hide(node: Any, secret: bool = False) -> Any:
    """A copy of `node` with every value under a secret-looking key HIDDEN (tables and lists keep their shape, so the
    same leaves are read, vetted and named), and every `NAME=value` string whose NAME looks secret cut after its '='."""
    if isinstance(node, dict):
        return {k: hide(v, secret or secret_looking(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [hide(v, secret) for v in node]
    if node is None:
        return None
    if secret:
        return HIDDEN
    if isinstance(node, str) and (m := ASSIGNMENT.match(node)) and secret_looking(m.group(2)):
        return m.group(1) + HIDDEN
    return node


def holds_hidden(value: Any) -> bool:
    """Whether a value made from the source carries a hidden one (a table's str(), a list): no spec setting can."""
    if isinstance(value, dict):
        return any(holds_hidden(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_hidden(v) for v in value)
    return isinstance(value, str) and HIDDEN in value


SECRET_NOTE = "a secret-looking key: its value is never copied; set it in the environment where the job runs, not in the spec"


def secret_note(*sources: str) -> str:
    """What a line naming `sources` (report sources: "a.b", "a, b", "a.{b, c}") adds where a name in them looks secret
    ("" where none does)."""
    names = [n.strip("{} ") for source in sources for n in re.split(r",\s*|\.\{", source)]
    return SECRET_NOTE if any(secret_looking(n) for n in names if n) else ""
