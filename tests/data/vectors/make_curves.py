"""Write ``curves.json``: the retention curves' pinned values, computed apart from the server.

Each value is worked out here in 40-digit decimal arithmetic straight from DESIGN §3 and
the curve definitions (the ``huber`` exponent, the ``elastic`` rate), sharing no code
with :mod:`calor.server.thermo.heat`; ``tests/test_curves.py`` matches the server to
them within 1e-9. Run it again only when a curve's definition changes on purpose:

    python tests/data/vectors/make_curves.py
"""

from __future__ import annotations

import json
from decimal import Decimal, getcontext
from pathlib import Path

getcontext().prec = 40

DAY = 86_400
PROFILES = {  # DESIGN §2: half-life in days, floor
    "episodic": (1, "0.01"),
    "semantic": (30, "0.05"),
    "preference": (90, "0.10"),
    "fact": (365, "0.15"),
    "core": (365, "0.60"),
}
KNEE = Decimal(1)  # huber: half-lives of exponential decay before it slows
GAMMA = Decimal("0.5")  # elastic: how much a memory's own heat sets its rate
PIVOT = Decimal("0.5")  # elastic: the heat that decays as fast as exponential
LN2 = Decimal(2).ln()
COLD = Decimal("0.10")  # the default cold threshold
MIGRATION_DAYS = 7


def exponent(curve: str, x: Decimal) -> Decimal:
    """log2(heat0 / heat) after x half-lives on the exponential and huber curves."""
    if curve == "exponential" or x <= KNEE:
        return x
    return 2 * (KNEE * x).sqrt() - KNEE


def decayed(curve: str, heat0: Decimal, x: Decimal) -> Decimal:
    if curve == "elastic":
        held = heat0**GAMMA - GAMMA * LN2 * PIVOT**GAMMA * x
        return held ** (1 / GAMMA) if held > 0 else Decimal(0)
    return heat0 * (-exponent(curve, x) * LN2).exp()


def until(curve: str, heat0: Decimal, level: Decimal) -> Decimal:
    """Half-lives until the curve from heat0 reaches level (level < heat0)."""
    if curve == "elastic":
        return (heat0**GAMMA - level**GAMMA) / (GAMMA * LN2 * PIVOT**GAMMA)
    e = (heat0 / level).ln() / LN2
    if curve == "exponential" or e <= KNEE:
        return e
    return (e + KNEE) ** 2 / (4 * KNEE)


def main() -> None:
    cases, crossings = [], []
    for curve in ("exponential", "huber", "elastic"):
        for memory_type, (days, floor_text) in PROFILES.items():
            floor = Decimal(floor_text)
            for stability in ("1.0", "2.5"):
                half_life = Decimal(days * DAY) * Decimal(stability)
                for heat0 in ("1.0", "0.62"):
                    for ages in ("0.25", "1", "2", "3.5", "10", "40"):
                        dt = (Decimal(ages) * half_life).to_integral_value()
                        heat = max(floor, decayed(curve, Decimal(heat0), dt / half_life))
                        cases.append(
                            {
                                "curve": curve,
                                "memory_type": memory_type,
                                "stability": float(stability),
                                "heat0": float(heat0),
                                "dt_seconds": int(dt),
                                "heat": float(heat),
                            }
                        )
            if floor >= COLD or memory_type == "core":
                continue
            half_life = Decimal(days * DAY)
            crossings.append(
                {
                    "curve": curve,
                    "memory_type": memory_type,
                    "heat0": 1.0,
                    "cold_after_seconds": float(half_life * until(curve, Decimal(1), COLD)),
                    "floor_after_seconds": float(half_life * until(curve, Decimal(1), floor)),
                    "archived_after_seconds": float(
                        half_life * until(curve, Decimal(1), floor) + MIGRATION_DAYS * DAY
                    ),
                }
            )
    about = (
        "Retention curves, time mode, source agent. x = dt / (half_life * stability). "
        "exponential: heat0 * 2^-x; huber: heat0 * 2^-(x if x <= 1 else 2*sqrt(x) - 1); "
        "elastic: (heat0^0.5 - 0.5 * ln2 * 0.5^0.5 * x)^2, 0 once that base is spent; "
        "then max(floor, heat). Crossings: seconds from t0 until heat 1.0 reaches the cold "
        "threshold 0.10 and the floor; archived = floor + 7 days. Tolerance 1e-9."
    )
    out = Path(__file__).with_name("curves.json")
    data = {"about": about, "cases": cases, "crossings": crossings}
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(cases)} cases and {len(crossings)} crossings to {out}")


if __name__ == "__main__":
    main()
