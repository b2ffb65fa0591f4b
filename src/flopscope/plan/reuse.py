"""Small runs kept for the rest of a plan: a screened plan's confirmations reuse its
references' runs (:mod:`flopscope.plan.screen` runs a role without stages at 3 and 4 decoder
layers; :mod:`flopscope.plan.layers` puts the same role together from 3, 4 and 5, so its
confirmation simulates only the 5-layer run, the check).
"""

from __future__ import annotations

from collections.abc import Hashable

from flopscope.estimate import Hardware
from flopscope.plan.degrees import Dims
from flopscope.plan.layers import Small
from flopscope.plan.roles import Build, RoleKey, Roles

__all__ = ["KeptRoles"]


class KeptRoles(Roles):
    """:class:`~flopscope.plan.roles.Roles` whose small runs are each simulated once per
    instance: the same role, layers per stage and stand-in (``like``) give the same run
    (a simulation is a function of them: the model, hardware and builder are the instance's).

    Attributes:
        reused: small runs asked for again and not simulated.
    """

    def __init__(self, build: Build, hardware: Hardware, identity: Hashable, *,
                 repeat_layers: bool = True, repeat_microbatches: bool = True,
                 repeat_degrees: bool = True) -> None:
        super().__init__(build, hardware, identity, repeat_layers=repeat_layers,
                         repeat_microbatches=repeat_microbatches,
                         repeat_degrees=repeat_degrees)
        self._kept: dict[tuple[RoleKey, int | None, RoleKey | None], tuple[Small, Dims]] = {}
        self.reused = 0

    def small(self, key: RoleKey, per_stage: int | None, like: RoleKey | None = None,
              dims: list[Dims] | None = None, calls: bool = False) -> Small:
        """:meth:`Roles.small <flopscope.plan.roles.Roles.small>`, simulated the first time
        only (and again where its call records are asked for and were not kept)."""
        at = (key, per_stage, like)
        found = self._kept.get(at)
        if found is None or (calls and not found[0].calls):
            got: list[Dims] = []
            run = super().small(key, per_stage, like, got, calls)
            found = self._kept[at] = (run, got[0] if got else None)
        else:
            self.reused += 1
        if dims is not None:
            dims.append(found[1])
        return found[0]
