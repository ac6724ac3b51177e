"""When two close statements disagree: negations, and numbers that say different things
about the same subject (not numbers that name different subjects)."""

from __future__ import annotations

import pytest

from calor.models.contrast import contradiction, same_numbers


@pytest.mark.parametrize(
    ("first", "second", "numbers"),
    [
        (
            "The standup meeting is at 9am on Mondays.",
            "The standup meeting is at 10am on Mondays.",
            "9 vs 10",
        ),
        (
            "Zorblax said the boiler pressure is 2 bar.",
            "Zorblax said the boiler pressure is 3 bar.",
            "2 vs 3",
        ),
        ("The garage door code is 4411.", "The garage door code is 4412.", "4411 vs 4412"),
        ("I have 2 cats at home.", "I have 3 cats at home.", "2 vs 3"),
        ("Row 5 has 3 items.", "Row 5 has 4 items.", "3 vs 4"),
        ("The boiler pressure is 2 bar.", "Zorblax measured the boiler at 3 bar.", "2 vs 3"),
        ("Ada's flight leaves at 7:30.", "Ada's flight leaves at 8:30.", "7:30 vs 8:30"),
        ("The parcel weighed 3 kg.", "The parcel weighed 4 kg.", "3 vs 4"),
        ("Ada paid 30 euros for the book.", "Ada paid 40 euros for the book.", "30 vs 40"),
    ],
)
def test_a_different_quantity_of_the_same_thing_is_a_conflict(
    first: str, second: str, numbers: str
) -> None:
    assert contradiction(first, second) == f"different numbers: {numbers}"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            "Ticket 12 is assigned to the support queue.",
            "Ticket 13 is assigned to the support queue.",
        ),
        ("Invoice 1001 was sent to the client.", "Invoice 1002 was sent to the client."),
        ("Room 101 has 4 chairs.", "Room 102 has 6 chairs."),
        ("Step #3 of the setup guide is done.", "Step #4 of the setup guide is done."),
        ("Ada Lovelace paid 30 euros for the book.", "Grace Hopper paid 40 euros for the book."),
        ("The boiler pressure is 2 bar.", "The boiler pressure is 2 bar today."),
        ("The meeting is on Monday.", "The meeting is at 10am."),
    ],
)
def test_numbers_that_name_different_subjects_or_agree_are_no_conflict(
    first: str, second: str
) -> None:
    assert contradiction(first, second) is None


def test_a_negation_in_one_only_is_a_conflict() -> None:
    assert contradiction(
        "The user is allergic to peanuts.", "The user is not allergic to peanuts."
    ) == ("one negates the other")
    assert contradiction("The user is not allergic.", "The user isn't allergic.") is None


def test_fifty_six_templated_memories_hold_no_conflict() -> None:
    texts = [
        f"Reminder {n}: water the plants in greenhouse {n % 7 + 1} at noon." for n in range(56)
    ]
    texts += [f"Order {n + 5000} shipped to the Lisbon warehouse." for n in range(56)]
    found = [(a, b) for i, a in enumerate(texts) for b in texts[i + 1 :] if contradiction(a, b)]
    assert found == []


def test_paraphrases_give_the_same_numbers_and_named_things_do_not() -> None:
    assert same_numbers("The gym opens at 6am on weekdays.", "The gym opens at 6 am on weekdays.")
    assert same_numbers("The cat is called Miso.", "Our cat's name is Miso.")
    assert not same_numbers("Episode 3 of the diary.", "Episode 4 of the diary.")
