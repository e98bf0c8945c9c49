"""How often a console login may be tried (pure: time passed in, no HTTP).

Every attempt is a strike against the client's address and against the operator name typed, taken
*before* the password is checked, so a burst of concurrent guesses counts in full; a success clears the
name's strikes. Past a few free strikes a key must wait, twice as long after each further strike (up to
a cap); strikes are forgotten after a quiet spell. A refused attempt adds no strike, so an operator
locked out by someone guessing gets back in once the guessing stops.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Strikes:
    count: int
    last: float


@dataclass(frozen=True)
class Refusal:
    """A login not tried: who must wait (``address`` or ``operator``) and for how long."""

    by: str
    wait_s: float

    @property
    def message(self) -> str:
        whom = "from this address" if self.by == "address" else "for this operator"
        return f"too many failed logins {whom}: try again in {max(1, round(self.wait_s))} s"


class LoginThrottle:
    def __init__(
        self,
        free_by_address: int = 10,
        free_by_name: int = 5,
        base_s: float = 5.0,
        cap_s: float = 900.0,
        forget_s: float = 900.0,
        max_keys: int = 10_000,
    ) -> None:
        self.free = {"address": free_by_address, "operator": free_by_name}
        self.base_s, self.cap_s, self.forget_s, self.max_keys = base_s, cap_s, forget_s, max_keys
        self._strikes: OrderedDict[tuple[str, str], Strikes] = OrderedDict()

    def _current(self, key: tuple[str, str], now: float) -> Strikes | None:
        strikes = self._strikes.get(key)
        if strikes is not None and now - strikes.last > self.forget_s:
            del self._strikes[key]
            return None
        return strikes

    def _wait(self, key: tuple[str, str], now: float) -> float:
        strikes = self._current(key, now)
        over = (strikes.count if strikes else 0) - self.free[key[0]]
        if strikes is None or over < 0:
            return 0.0
        return max(0.0, min(self.cap_s, self.base_s * 2.0**over) - (now - strikes.last))

    def attempt(self, address: str, operator: str, now: float) -> Refusal | None:
        """None: go ahead (the attempt is counted as a strike until it succeeds); else who must wait."""
        keys = (("address", address), ("operator", operator))
        for key in keys:
            wait = self._wait(key, now)
            if wait > 0:
                return Refusal(key[0], wait)
        for key in keys:
            strikes = self._current(key, now) or Strikes(0, now)
            strikes.count, strikes.last = strikes.count + 1, now
            self._strikes[key] = strikes
            self._strikes.move_to_end(key)
        while len(self._strikes) > self.max_keys:  # bounded memory under a spray of names
            self._strikes.popitem(last=False)
        return None

    def succeeded(self, address: str, operator: str) -> None:
        """The password was right: the operator's strikes go, and this attempt's strike on the address."""
        self._strikes.pop(("operator", operator), None)
        strikes = self._strikes.get(("address", address))
        if strikes is not None:
            strikes.count = max(0, strikes.count - 1)
