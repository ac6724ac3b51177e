"""Emotional valence: signs, negation, intensifiers and bounds."""

from __future__ import annotations

from calor.models.valence import valence


def test_valence_signs() -> None:
    assert valence("I love this, it works perfectly and I'm so happy!") > 0.5
    assert valence("This is terrible, the deploy failed and I'm frustrated.") < -0.5
    assert valence("The meeting is at 3pm in room 4.") == 0.0


def test_valence_negation_flips_the_next_word() -> None:
    assert valence("good") > 0 > valence("not good")
    assert valence("bad") < 0 < valence("not bad")
    assert valence("it didn't work, never helpful") < 0
    assert valence("I can't stand verbose logs") < 0


def test_valence_intensifiers_and_bounds() -> None:
    assert valence("very good") > valence("good") > valence("slightly good") > 0
    for text in ("love " * 500, "hate " * 500, "!" * 100):
        assert -1.0 <= valence(text) <= 1.0
