"""Names that look alike are one name or none: keys and operator names refuse every
character that renders as nothing, are compared in NFC and measured in NFC."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from opledger.ledger import InvalidIdentifier, MalformedOperationId, UnknownAction
from opledger.ledger.ids import (
    MAX_DECOMPOSITION,
    MAX_IDENTIFIER_LENGTH,
    check_action,
    check_key,
    check_operation_id,
    check_operator,
    default_ignorable,
)

# Default_Ignorable_Code_Point as DerivedCoreProperties-14.0.0.txt lists it (the derived
# list, not its definition), the same through 15.1: "# Total code points: 4174".
PUBLISHED = """
00AD 034F 061C 115F..1160 17B4..17B5 180B..180D 180E 180F 200B..200F 202A..202E
2060..2064 2065 2066..206F 3164 FE00..FE0F FEFF FFA0 FFF0..FFF8 1BCA0..1BCA3 1D173..1D17A
E0000 E0001 E0002..E001F E0020..E007F E0080..E00FF E0100..E01EF E01F0..E0FFF
"""


def _published() -> frozenset[int]:
    points: set[int] = set()
    for item in PUBLISHED.split():
        low, _, high = item.partition("..")
        points.update(range(int(low, 16), int(high or low, 16) + 1))
    return frozenset(points)


IGNORABLE = _published()
IGNORABLE_SORTED = sorted(IGNORABLE)
LETTERS = st.text(st.characters(categories=["Ll", "Lu", "Nd"]), max_size=40)


def refusal(value: object, *, check: Callable[[str, object], str] = check_key) -> InvalidIdentifier:
    with pytest.raises(InvalidIdentifier) as info:
        check("key", value)
    return info.value


def test_the_published_list_has_its_stated_total() -> None:
    assert len(IGNORABLE) == 4174


def test_default_ignorable_is_the_published_property_over_the_whole_code_space() -> None:
    """The predicate is derived from categories and PropList's short lists; the oracle is
    the derived list Unicode publishes. If Python's Unicode moves past 15.1 and this fails,
    compare the new DerivedCoreProperties.txt and PropList.txt with opledger.ledger.ids."""
    wrong = [
        f"U+{cp:04X}" for cp in range(0x110000) if default_ignorable(chr(cp)) != (cp in IGNORABLE)
    ]
    assert wrong == [], f"Unicode {unicodedata.unidata_version}: {wrong[:20]}"


def test_every_default_ignorable_code_point_is_refused_and_named_escaped() -> None:
    for cp in IGNORABLE_SORTED:
        for value in (f"ca{chr(cp)}se-7", f"{chr(cp)}case-7", f"case-7{chr(cp)}"):
            error = refusal(value)
            assert error.fields["code_point"] == f"U+{cp:04X}"
            assert f"U+{cp:04X}" in str(error) and str(error).isascii()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("ca\u034fse-7", "U+034F COMBINING GRAPHEME JOINER"),
        ("case-7\ufe0f", "U+FE0F VARIATION SELECTOR-16"),
        ("case-7\U000e0100", "U+E0100 VARIATION SELECTOR-17"),
        ("case\u180b-7", "U+180B MONGOLIAN FREE VARIATION SELECTOR ONE"),
        ("case\u180f-7", "U+180F MONGOLIAN FREE VARIATION SELECTOR FOUR"),
        ("case\u17b4-7", "U+17B4 KHMER VOWEL INHERENT AQ"),
        ("case\u17b5-7", "U+17B5 KHMER VOWEL INHERENT AA"),
        ("case\u115f-7", "U+115F HANGUL CHOSEONG FILLER"),
        ("case-7\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A"),
        ("case-7\u2065", "U+2065"),  # reserved, default-ignorable already
        ("case\u2800-7", "U+2800 BRAILLE PATTERN BLANK"),  # blank, though a symbol
        ("case\u0600-7", "U+0600 ARABIC NUMBER SIGN"),  # a visible format character
        ("case\ufff9-7", "U+FFF9 INTERLINEAR ANNOTATION ANCHOR"),  # hides what follows
        ("case\u2028-7", "U+2028 LINE SEPARATOR"),
        ("case\u2029-7", "U+2029 PARAGRAPH SEPARATOR"),
        ("case\ue000-7", "U+E000"),  # private use
        ("case\U000f0000-7", "U+F0000"),  # private use, plane 15
        ("case\u0378-7", "U+0378"),  # unassigned
        ("case\ufdd0-7", "U+FDD0"),  # a noncharacter
        ("case\x00-7", "U+0000"),
        ("case\x85-7", "U+0085"),  # a C1 control
        ("\u0301case-7", "U+0301 COMBINING ACUTE ACCENT"),  # a mark with no base
        ("\u0903case-7", "U+0903 DEVANAGARI SIGN VISARGA"),  # a spacing mark, no base
        ("\u20ddcase-7", "U+20DD COMBINING ENCLOSING CIRCLE"),  # an enclosing mark
    ],
)
def test_characters_that_make_two_keys_look_alike_are_refused(value: str, named: str) -> None:
    error = refusal(value)
    assert f"key contains {named} at index" in str(error)
    assert error.fields["field"] == "key" and str(error).isascii() and "\n" not in str(error)


@pytest.mark.parametrize("value", [" case-7", "case-7 ", "case-7\u3000", "\u00a0case-7"])
def test_leading_or_trailing_white_space_is_refused(value: str) -> None:
    assert "leading or trailing white space" in str(refusal(value))


def test_what_renders_is_kept() -> None:
    assert check_key("key", "e\u0301") == "\u00e9"  # the mark has its base
    assert check_key("key", "case 7") == "case 7"
    assert check_key("key", "\u0645\u0631\u062d\u0628\u0627") == "\u0645\u0631\u062d\u0628\u0627"
    assert check_key("key", "\ud55c\uad6d") == "\ud55c\uad6d"  # Hangul syllables
    assert check_key("key", "\u0915\u094d\u0937") == "\u0915\u094d\u0937"  # a conjunct


def test_operator_names_refuse_the_same_and_what_does_not_print() -> None:
    error = refusal("al\u034fice", check=check_operator)
    assert "U+034F COMBINING GRAPHEME JOINER" in str(error) and str(error).isascii()
    assert "U+00A0 NO-BREAK SPACE" in str(refusal("al\u00a0ice", check=check_operator))
    assert check_operator("operator", "Jose\u0301") == "Jos\u00e9"


def test_the_length_limit_counts_the_nfc_form() -> None:
    accepted = "\u00e9" * 150
    nfd = unicodedata.normalize("NFD", accepted)
    assert len(nfd) == 300 and check_key("key", nfd) == accepted
    error = refusal(unicodedata.normalize("NFD", "\u00e9" * (MAX_IDENTIFIER_LENGTH + 1)))
    assert str(error) == "key is 201 characters in NFC; the limit is 200"


def test_the_longest_decomposition_is_accepted_at_the_limit() -> None:
    """U+1F82 decomposes into four code points: 200 of them are 800 in NFD, still one key."""
    key = "\u1f82" * MAX_IDENTIFIER_LENGTH
    nfd = unicodedata.normalize("NFD", key)
    assert len(nfd) == MAX_DECOMPOSITION * MAX_IDENTIFIER_LENGTH
    assert check_key("key", nfd) == key
    error = refusal("a" + nfd)
    assert str(error) == "key is 801 characters; the limit is 200"


def test_no_code_point_decomposes_into_more_than_the_bound() -> None:
    """The early length check (before normalising) relies on this."""
    longest = max(
        len(unicodedata.normalize("NFD", chr(cp)))
        for cp in range(0x110000)
        if unicodedata.decomposition(chr(cp))
    )
    assert longest == MAX_DECOMPOSITION


def test_normalising_brings_in_no_refused_character() -> None:
    """The characters are checked as the caller sent them; no accepted character turns into
    a refused one under NFC or NFD, so the stored key holds none either."""
    for cp in range(0x110000):
        ch = chr(cp)
        if not unicodedata.decomposition(ch) or unicodedata.category(ch) in ("Cs", "Cn"):
            continue
        try:
            check_key("key", f"a{ch}")
        except InvalidIdentifier:
            continue
        for form in ("NFC", "NFD"):
            assert check_key("key", "a" + unicodedata.normalize(form, ch))


def test_errors_on_other_ids_show_invisible_characters_escaped() -> None:
    with pytest.raises(MalformedOperationId) as bad_id:
        check_operation_id("op_\u034f")
    with pytest.raises(UnknownAction) as bad_action:
        check_action("crm\u034f.close_case.v1")
    assert "\\u034f" in str(bad_id.value) and str(bad_id.value).isascii()
    assert "\\u034f" in str(bad_action.value) and str(bad_action.value).isascii()


@given(st.text(max_size=90), st.sampled_from(IGNORABLE_SORTED), st.text(max_size=90))
def test_any_text_with_a_default_ignorable_code_point_is_refused(
    before: str, cp: int, after: str
) -> None:
    for check in (check_key, check_operator):
        error = refusal(before + chr(cp) + after, check=check)
        assert str(error).isascii() and "\n" not in str(error)


@given(LETTERS, st.sampled_from(IGNORABLE_SORTED), LETTERS)
def test_the_refusal_names_the_invisible_code_point(before: str, cp: int, after: str) -> None:
    assert refusal(before + chr(cp) + after).fields["code_point"] == f"U+{cp:04X}"


@given(st.text(max_size=3 * MAX_IDENTIFIER_LENGTH), st.integers(1, MAX_IDENTIFIER_LENGTH))
def test_an_accepted_key_is_nfc_within_its_limit_and_visible(value: str, limit: int) -> None:
    try:
        key = check_key("key", value, max_length=limit)
    except InvalidIdentifier:
        return
    assert unicodedata.is_normalized("NFC", key) and len(key) <= limit
    assert key == key.strip() and not unicodedata.category(key[0]).startswith("M")
    assert not any(default_ignorable(ch) for ch in key)
    refused = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
    assert not any(unicodedata.category(ch) in refused for ch in key)
    assert check_key("key", key, max_length=limit) == key


#: precomposed letters (one decomposes into four code points, Hangul into three), bases
#: with marks that NFC composes or reorders, and plain letters
PRECOMPOSED = ["\u00e9", "\u00f1", "\u00c5", "\u1e69", "\u1f82", "\u01d5", "\ud55c", "\uac01"]
spelling_parts = st.sampled_from(
    [*PRECOMPOSED, "e\u0301", "s\u0323\u0307", "s\u0307\u0323", "q\u0307\u0323", "a", "Z", "-"]
)


@given(st.lists(spelling_parts, min_size=1, max_size=MAX_IDENTIFIER_LENGTH))
def test_an_nfd_spelling_of_an_accepted_key_is_the_same_key(parts: list[str]) -> None:
    value = "".join(parts)
    assume(len(unicodedata.normalize("NFC", value)) <= MAX_IDENTIFIER_LENGTH)
    key = check_key("key", value)
    assert check_key("key", unicodedata.normalize("NFD", value)) == key
    assert check_key("key", unicodedata.normalize("NFD", key)) == key
