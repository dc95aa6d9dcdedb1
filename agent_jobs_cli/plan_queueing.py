"""The queueing formulas of the capacity and cost plan (see `plan` for the model): M/G/1 and Erlang C waits, a
lognormal duration's coefficient of variation, and a binomial p99."""

from __future__ import annotations

import math
from typing import Final

# z of the standard normal at 0.99, for the p99s below.
Z99: Final = 2.3263478740408408


def lognormal_cv(mean: float, p99: float | None) -> float:
    """The coefficient of variation of a lognormal duration with this mean and p99 (0: deterministic)."""
    if p99 is None or p99 <= mean:
        return 0.0
    # ln p99 = mu + Z99 sigma and ln mean = mu + sigma^2 / 2  =>  sigma^2 / 2 - Z99 sigma + ln(p99 / mean) = 0.
    discriminant = Z99 * Z99 - 2 * math.log(p99 / mean)
    sigma = Z99 - math.sqrt(discriminant) if discriminant > 0 else Z99
    return math.sqrt(math.expm1(sigma * sigma))


def mg1_wait(rate: float, service_seconds: float, cv: float = 0.0) -> float:
    """Pollaczek-Khinchine: mean wait in queue of an M/G/1 server (M/D/1 at cv 0); inf when rho >= 1."""
    rho = rate * service_seconds
    if rho >= 1:
        return math.inf
    return rho * service_seconds * (1 + cv * cv) / (2 * (1 - rho))


def erlang_c_wait(servers: int, offered_load: float, service_seconds: float) -> float:
    """Mean wait for a server in M/M/c with `offered_load` = arrival rate x service time; inf when it is >= c."""
    if offered_load >= servers:
        return math.inf
    # Erlang B by its stable recurrence, then C from B.
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    utilisation = offered_load / servers
    waiting_probability = blocking / (1 - utilisation + utilisation * blocking)
    return waiting_probability * service_seconds / (servers - offered_load)


def binomial_quantile(trials: int, p: float, q: float = 0.99) -> int:
    """The smallest k with P(Binomial(trials, p) <= k) >= q (a normal approximation above 2000 trials)."""
    if p <= 0:
        return 0
    if p >= 1:
        return trials
    if trials > 2000:
        mean, sd = trials * p, math.sqrt(trials * p * (1 - p))
        return min(trials, math.ceil(mean + Z99 * sd))
    pmf = (1 - p) ** trials
    cumulative = pmf
    k = 0
    while cumulative < q and k < trials:
        pmf *= (trials - k) / (k + 1) * p / (1 - p)
        k += 1
        cumulative += pmf
    return k
