"""The faults a :class:`FaultPlan` holds for the fault proxy
(semq.testing.faultproxy), drawn from its seed: what each connection will
suffer (:meth:`FaultPlan.connection_faults`, a pure function of the seed and
the connection's index) and the generator of each direction's per-chunk
choices. No networking here: a test can ask the plan what will happen and
check that it did.

Determinism: every random choice comes from ``random.Random`` seeded with a
string derived from ``(plan.seed, connection index, direction)``. String
seeds are hashed with SHA-512 by :mod:`random`, so they do not depend on
``PYTHONHASHSEED`` and the same seed gives the same faults in every process.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_MAX_CHUNK", "DEFAULT_MAX_CONNECTIONS", "ConnectionFaults", "Direction",
           "FaultPlan", "RefuseMode"]

DEFAULT_MAX_CHUNK: Final = 65536  # bytes read per receive_some: bounds memory per direction
DEFAULT_MAX_CONNECTIONS: Final = 1024  # concurrent connections; more are refused
DEFAULT_CONNECT_TIMEOUT: Final = 5.0  # seconds to reach the upstream before giving up


class Direction(enum.Enum):
    """Which way bytes flow through the proxy."""

    UP = "up"  # client (node) -> upstream (platform)
    DOWN = "down"  # upstream (platform) -> client (node)


class RefuseMode(enum.Enum):
    """How a refused connection is treated while a refuse period lasts."""

    CLOSE = "close"  # accept, then close at once: the client sees EOF / reset
    HOLD = "hold"  # accept, never connect upstream, close when the period ends:
    #                the client sees a connection that never answers (a black hole)


def _check_range(name: str, value: tuple[float, float], *, minimum: float = 0.0) -> None:
    lo, hi = value
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{name}={value!r}: bounds must be finite")
    if lo < minimum or hi < lo:
        raise ValueError(f"{name}={value!r}: need {minimum} <= low <= high")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}={value!r}: a probability must be within [0, 1]")


@dataclass(frozen=True, kw_only=True)
class ConnectionFaults:
    """What the plan holds for one connection. ``index`` numbers the accepted
    connections that were not refused (0, 1, ...), in accept order.

    ``cut_offset`` counts bytes forwarded in ``cut_direction`` on this
    connection: exactly that many are forwarded, then both sides are closed.
    ``refuse_seconds`` > 0: after that cut, new connections are refused for so long.
    """

    index: int
    cut_direction: Direction | None
    cut_offset: int | None
    refuse_seconds: float


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """The faults to inject, all drawn from ``seed``. The default plan injects
    nothing; every knob is off until set. Times are seconds of trio's clock, so
    a fake clock (``autojump_clock``) drives them in tests.

    Raises ``ValueError`` naming the knob when a value is out of range.
    """

    seed: int = 0
    # Wait uniformly in [low, high] before forwarding each chunk (latency/jitter).
    delay: tuple[float, float] = (0.0, 0.0)
    # Per chunk, with this probability, hold the direction for uniform(stall_seconds).
    stall_probability: float = 0.0
    stall_seconds: tuple[float, float] = (1.0, 5.0)
    # Per connection, with this probability, cut it after uniform-int(cut_offset)
    # bytes in one of cut_directions (chosen uniformly). Offsets are inclusive.
    cut_probability: float = 0.0
    cut_offset: tuple[int, int] = (0, 65536)
    cut_directions: tuple[Direction, ...] = (Direction.UP, Direction.DOWN)
    # Close a cut with RST (SO_LINGER 0) instead of FIN. With RST the kernel may
    # drop bytes not yet delivered, so the peer can see fewer than cut_offset.
    cut_reset: bool = False
    # After a planned cut, with this probability refuse new connections for
    # uniform(refuse_seconds): the platform "is unreachable" for a while.
    refuse_probability: float = 0.0
    refuse_seconds: tuple[float, float] = (1.0, 10.0)
    refuse_mode: RefuseMode = RefuseMode.CLOSE
    # > 0: forward each chunk as random pieces of 1..fragment bytes, one
    # send_all each, so the receiver's decoder sees frames split anywhere.
    fragment: int = 0
    # True: forward untouched; every planned fault above is off (explicit
    # FaultProxy commands still apply).
    pass_through: bool = False
    max_chunk: int = DEFAULT_MAX_CHUNK
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT

    def __post_init__(self) -> None:
        _check_range("delay", self.delay)
        _check_range("stall_seconds", self.stall_seconds)
        _check_range("refuse_seconds", self.refuse_seconds)
        _check_range("cut_offset", (float(self.cut_offset[0]), float(self.cut_offset[1])))
        _check_probability("stall_probability", self.stall_probability)
        _check_probability("cut_probability", self.cut_probability)
        _check_probability("refuse_probability", self.refuse_probability)
        if self.cut_probability > 0 and not self.cut_directions:
            raise ValueError("cut_probability > 0 needs at least one of cut_directions")
        if self.fragment < 0:
            raise ValueError(f"fragment={self.fragment}: must be >= 0")
        if self.max_chunk < 1:
            raise ValueError(f"max_chunk={self.max_chunk}: must be >= 1")
        if self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections}: must be >= 1")
        if not self.connect_timeout > 0:
            raise ValueError(f"connect_timeout={self.connect_timeout}: must be > 0")

    @classmethod
    def chaos(cls, seed: int) -> FaultPlan:
        """A plan for chaos runs: a little jitter, rare stalls, a third of the
        connections cut somewhere in their first 256 KiB, and after a third of
        the cuts the upstream is unreachable for 1-5 s."""
        return cls(
            seed=seed,
            delay=(0.0, 0.002),
            stall_probability=0.002,
            stall_seconds=(0.5, 3.0),
            cut_probability=0.33,
            cut_offset=(0, 256 * 1024),
            refuse_probability=0.33,
            refuse_seconds=(1.0, 5.0),
        )

    def connection_faults(self, index: int) -> ConnectionFaults:
        """The faults of the ``index``-th accepted, not refused connection
        (0-based). Pure: the same plan and index always give the same answer."""
        rng = random.Random(f"semq-faultproxy/{self.seed}/conn/{index}")
        # Draw every value unconditionally so that changing one probability does
        # not shift the others for the same seed.
        cut_roll = rng.random()
        direction = (
            self.cut_directions[rng.randrange(len(self.cut_directions))]
            if self.cut_directions
            else None
        )
        offset = rng.randint(self.cut_offset[0], self.cut_offset[1])
        refuse_roll = rng.random()
        refuse_for = rng.uniform(*self.refuse_seconds)
        cut = cut_roll < self.cut_probability and direction is not None
        return ConnectionFaults(
            index=index,
            cut_direction=direction if cut else None,
            cut_offset=offset if cut else None,
            refuse_seconds=refuse_for if cut and refuse_roll < self.refuse_probability else 0.0,
        )

    def chunk_rng(self, index: int, direction: Direction) -> random.Random:
        """The generator for per-chunk choices (delay, stall, fragments) of one
        direction of one connection."""
        return random.Random(f"semq-faultproxy/{self.seed}/conn/{index}/{direction.value}")
