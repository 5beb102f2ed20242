"""Step timing shared by the training loops (Table 2's seconds per step)."""

from __future__ import annotations


class StepClock:
    """Accumulates per-step wall time and reports the steady-state mean.

    The first step pays one-off costs (lazy allocations, kernel selection, page faults of
    freshly gathered rows), which made short runs look several times slower than long ones,
    so ``steady_ms`` averages steps 2..T and ``first_ms`` reports step 1 on its own.

    >>> c = StepClock()
    >>> for dt in (0.020, 0.001, 0.003): c.add(dt)
    >>> round(c.steady_ms, 6), round(c.first_ms, 6), round(c.total_s, 6)
    (2.0, 20.0, 0.024)
    """

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.first_s = 0.0

    def add(self, seconds: float) -> None:
        if self.count == 0:
            self.first_s = seconds
        self.count += 1
        self.total_s += seconds

    @property
    def first_ms(self) -> float:
        return 1000.0 * self.first_s

    @property
    def steady_ms(self) -> float:
        """Mean ms per step without the first (the only step's time when there is one)."""
        if self.count <= 1:
            return 1000.0 * self.total_s
        return 1000.0 * (self.total_s - self.first_s) / (self.count - 1)
