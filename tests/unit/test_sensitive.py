"""What counts as a secret in a recorded document: a key by the words of its name, a value by
its shape, at any depth; and what is deliberately not one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from opledger.ledger.sensitive import (
    RedactionRuleInvalid,
    luhn,
    mask,
    name_words,
    parse_rules,
    rule_specs,
    scrub,
    secret_name,
    secret_shape,
)

# every key seen in clear on the review and operation pages (issue 30), as a path
SEEN_IN_CLEAR = [
    ("card", "number"),
    ("cardNumber",),
    ("access_token",),
    ("client_secret",),
    ("new_password",),
    ("headers", "X-Api-Key"),
    ("pan",),
]


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    doc: Any = value
    for key in reversed(path):
        doc = {key: doc}
    return dict(doc)


def _at(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@pytest.mark.parametrize("path", SEEN_IN_CLEAR, ids=".".join)
def test_each_key_seen_in_clear_is_hidden_at_any_depth(path: tuple[str, ...]) -> None:
    value = "visible-if-broken"
    for doc in (
        _nest(path, value),
        {"customer": {"profile": _nest(path, value)}},  # deeper
        {"lines": [{"x": 1}, _nest(path, value)]},  # inside a list
    ):
        original = copy.deepcopy(doc)
        hidden: list[str] = []
        shown = scrub(doc, hidden=hidden)
        assert "visible-if-broken" not in repr(shown)
        assert len(hidden) == 1 and hidden[0].endswith(path[-1])
        assert doc == original  # the document itself is untouched
    shown = scrub(_nest(path, value))
    assert _at(shown, path) == "[hidden: text, 17 characters]"


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("cardNumber", ("card", "number")),
        ("X-Api-Key", ("x", "api", "key")),
        ("APIKey", ("api", "key")),
        ("client_secret", ("client", "secret")),
        ("card.number", ("card", "number")),
        ("cvv2", ("cvv", "2")),
        ("sessionID", ("session", "id")),
    ],
)
def test_a_name_is_split_into_words_whatever_its_case_style(
    key: str, words: tuple[str, ...]
) -> None:
    assert name_words(key) == words


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "Passwd",
        "secretAccessKey",
        "refresh_token",
        "apikey",
        "api-key",
        "private_key",
        "Authorization",
        "Proxy-Authorization",
        "auth",
        "Set-Cookie",
        "session_id",
        "credentials",
        "CVC",
        "cvv2",
        "iban",
        "ssn",
        "social_security_number",
        "pin",
        "otp_code",
        "webhook_signature",
        "security_code",
        "account_number",
        "passwords",  # a plural is its singular
    ],
)
def test_secret_words_and_pairs(key: str) -> None:
    assert secret_name(key, "x")


@pytest.mark.parametrize(
    "key",
    [
        "idempotency_key",
        "key",
        "public_key",
        "number",
        "case_number",
        "author",
        "pinned_at",
        "authorized_by",
        "span",
        "tokenization_method",
        "keys",
        "passenger",
    ],
)
def test_a_word_inside_another_or_key_and_number_alone_are_not_secrets(key: str) -> None:
    assert not secret_name(key, "x")


def test_a_parents_last_word_pairs_with_its_childs_first() -> None:
    assert secret_name("number", "x", parent="card")
    assert secret_name("number", "x", parent="cards")  # a list of cards
    assert secret_name("key", "x", parent="api")
    assert not secret_name("number", "x", parent="case")
    assert not secret_name("key", "x", parent="headers")


def test_tallies_booleans_and_nulls_under_secret_names_are_shown() -> None:
    # how many tokens a model used is not a token; one bit, or nothing, is no secret
    for key in ("token_count", "max_tokens", "total_tokens", "prompt_tokens", "sessions_used"):
        assert not secret_name(key, 128), key
    for key, value in (("has_password", True), ("password_set", False), ("token", None)):
        assert not secret_name(key, value), key
    # but a number that can be the secret itself is hidden, whatever its name says
    for key in ("pin", "cvc", "pin_count", "token", "otp"):
        assert secret_name(key, 1234), key
    assert secret_name("max_tokens", "sk-not-a-number")  # a text under a tally name


CARDS = [
    "4222222222222",  # 13 digits
    "30569309025904",  # 14
    "378282246310005",  # 15
    "4242424242424242",  # 16
    "6275980000000000006",  # 19
    "4242 4242 4242 4242",
    "4242-4242-4242-4242",
    "3782 822463 10005",
    "card 4242 4242 4242 4242 was declined",  # inside a text
]


@pytest.mark.parametrize("value", CARDS)
def test_a_card_number_is_hidden_whatever_its_key(value: str) -> None:
    assert secret_shape(value) == "card number"
    shown = scrub({"memo": value})
    assert shown == {"memo": f"[hidden card number: text, {len(value)} characters]"}


def test_a_card_number_as_a_json_number_is_hidden() -> None:
    assert scrub({"n": 4242424242424242}) == {"n": "[hidden card number: int]"}


@pytest.mark.parametrize(
    "value",
    [
        "4242424242424241",  # fails the Luhn check
        "1718000000123",  # a timestamp in milliseconds (passes Luhn; no card starts with 1)
        "424242424242",  # 12 digits
        "42424242424242424242",  # 20 digits: a longer number is not searched inside
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14",  # short groups are a list, not a card
        "2024-06-01 12:00",
        "+1 415-555-0100",
    ],
)
def test_digits_that_are_no_card_number_are_shown(value: str) -> None:
    assert secret_shape(value) is None
    assert scrub({"v": value}) == {"v": value}
    assert luhn("79927398713") and not luhn("79927398710")


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("Bearer abcDEF123456.xyz", "authorization"),
        ("Basic dXNlcjpwYXNzd29yZA==", "authorization"),
        ("bearer 0123456789abcdefXYZ", "authorization"),
        ("the call sent Bearer 0123456789abcdefXYZ and failed", "authorization"),
        (
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
            "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
            "JWT",
        ),
        ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "API key"),
        ("sk_test_4eC39HqLyjWDarjtT1zdp7dc", "API key"),
        ("rk_live_51H8abcdefghij", "API key"),
        ("whsec_" + "a1" * 16, "API key"),
        ("xoxb-123456789012-abcdefABCDEF", "API key"),
        ("xoxp-123456789012-abcdefABCDEF", "API key"),
        ("xoxa-2-123456789012-abcdef", "API key"),
        ("ghp_" + "A1b2" * 9, "API key"),
        ("AKIAIOSFODNN7EXAMPLE", "API key"),
        ("AIza" + "S" * 35, "API key"),
        ("sk-proj-abcdefghijklmnopqrstuvwxyz", "API key"),
        ("SG." + "a" * 22 + "." + "b" * 43, "API key"),
        ("invalid key sk_live_4eC39HqLyjWDarjtT1zdp7dc provided", "API key"),
        ("-----BEGIN PRIVATE KEY-----\nMIIEv...\n-----END PRIVATE KEY-----", "private key"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE", "private key"),
        ("connect to postgresql://app:hunter2@db:5432/ledger failed", "URL with a password"),
    ],
)
def test_each_secret_shape_is_hidden_whatever_its_key(value: str, kind: str) -> None:
    assert secret_shape(value) == kind
    hidden: list[str] = []
    shown = scrub({"lines": [{"note": value}]}, hidden=hidden)
    assert shown == {"lines": [{"note": f"[hidden {kind}: text, {len(value)} characters]"}]}
    assert hidden == ["lines[0].note"]


@pytest.mark.parametrize(
    "value",
    [
        "Basic information",  # a scheme's name followed by a word is prose
        "crm.close_case.v1",  # three dotted parts are no JWT without its header
        "www.example.com",
        "https://example.com/path?q=1",
        "pk_live_abcdefghijklmnop",  # a publishable key is meant to be public
        "pi_3MtwBwLkdIwHu7ix28a3tqPa",
        "op_01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "task-list",
    ],
)
def test_look_alikes_are_shown(value: str) -> None:
    assert secret_shape(value) is None


def test_a_secret_name_hides_a_whole_object_or_list_and_says_its_size() -> None:
    doc = {"credentials": {"user": "u", "password": "p"}, "cookies": ["a", "b"], "ok": 1}
    assert scrub(doc) == {
        "credentials": "[hidden: object, 2 fields]",
        "cookies": "[hidden: list, 2 items]",
        "ok": 1,
    }
    assert mask(3.5) == "[hidden: float]" and mask("x", "JWT") == "[hidden JWT: text, 1 character]"


def test_paths_and_result_paths() -> None:
    doc = {"note": "n", "result": {"email": "e", "note": "kept"}, "deep": {"result": {"a": 1}}}
    hidden: list[str] = []
    shown = scrub(doc, [["note"]], result_paths=[["email"]], hidden=hidden)
    assert shown["note"].startswith("[hidden") and shown["result"]["email"].startswith("[hidden")
    assert shown["result"]["note"] == "kept" and shown["deep"] == {"result": {"a": 1}}
    assert hidden == ["note", "result.email"]
    assert doc["note"] == "n"  # untouched


def test_rules_parse_and_a_malformed_one_is_one_typed_line() -> None:
    assert parse_rules(rule_specs("crm.*=note, customer.email ; email.*=subject;")) == (
        ("crm.*", ("note", "customer.email")),
        ("email.*", ("subject",)),
    )
    assert rule_specs(None) == [] and rule_specs("") == []
    with pytest.raises(RedactionRuleInvalid) as refused:
        parse_rules(["crm.*"])
    assert str(refused.value) == (
        "redaction rule 'crm.*': use ACTION=field[,field...], e.g. 'crm.*=note,customer.email'"
    )


def test_free_text_keeps_its_words_and_loses_its_secrets() -> None:
    from opledger.ledger.sensitive import scrub_text

    said = (
        "401 for Authorization: Bearer abcDEF0123456789xyzQ at card 4242 4242 4242 4242, "
        "key sk_live_4eC39HqLyjWDarjtT1zdp7dc via https://bob:hunter2@api.example/ on case-318"
    )
    out = scrub_text(said)
    for secret in ("abcDEF0123456789xyzQ", "4242 4242", "sk_live_", "hunter2"):
        assert secret not in out, out
    for word in ("401 for Authorization:", "at card", "on case-318", "api.example/"):
        assert word in out, out
    assert "[hidden card number: text, 19 characters]" in out
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY----- after"
    assert scrub_text(pem) == "[hidden private key: text, 68 characters] after"
    plain = "3 attempts, none of which reached the provider (in flight until 12:00:01)"
    assert scrub_text(plain) == plain
