"""The case: one frozen, typed value built once from a resolved sweep point and one of its shapes.

`build` reads the point's backend knobs into the backend's own `Knobs` (fp8bench.backends.build_knobs), derives
the identity and the id (fp8bench.cases.identity) and its BF16 twin's id. What can run is decided later, once,
by the planner (fp8bench.run.plan), which returns the case with `runnable` and `reason` set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fp8bench.backends import Recipe, build_knobs, variant_of_knobs
from fp8bench.cases import identity as ident_mod
from fp8bench.config.schema import Config, FormatConfig, ScalingConfig, check_name
from fp8bench.core.types import FP8_ALL_GATHER_TAG, Format, Scaling
from fp8bench.models import shapes as shapes_module


@dataclass(frozen=True, kw_only=True)
class Case:
    """One measurement: a sweep point narrowed to one shape, typed and identified."""

    config: Config
    """The resolved point it came from (the request, as composed)."""
    shape_name: str
    shape: dict
    recipe: Recipe
    """Format, scaling and the backend's own knobs, typed."""
    unhonoured: dict = field(default_factory=dict)
    """Knobs the request sets that the backend does not declare (`backend.<knob>`, non-default): the case is
    skipped with them named."""
    identity: dict = field(default_factory=dict)
    case_id: str = ""
    label: str = ""
    """The readable prefix of the id: what people and plots read."""
    twin_id: str = ""
    """The id of the BF16 case its speedup divides by (its own id for a BF16 case)."""
    group: str = ""
    """Its twin group: every case whose BF16 twin comes from the same point (one process runs them)."""
    runnable: bool = True
    reason: str = ""
    added: bool = False
    """A BF16 twin the request did not name, added so that every speedup divides by a recorded case."""

    @property
    def params(self) -> dict:
        """What a record states the case was: its identity without the prefix and the shape (their own columns)."""
        return {k: v for k, v in self.identity.items() if k not in ident_mod.PREFIX_KEYS and not k.startswith("shape.")}

    @property
    def is_bf16(self) -> bool:
        return self.recipe.format is Format.BF16

    def with_verdict(self, runnable: bool, reason: str) -> Case:
        return dataclasses.replace(self, runnable=runnable, reason="" if runnable else reason)


def build(config: Config, shape_name: str, shape: dict) -> Case:
    """The typed case of `config` at one of its shapes (ConfigError for bad input: an unknown knob, a knob of
    the wrong type, a name that is not a name)."""
    knobs, unhonoured = build_knobs(config.backend_name, config.backend)
    recipe = Recipe(format=Format(config.format.name), scaling=Scaling(config.scaling.name),
                    scaling_cfg=config.scaling, backend=config.backend_name, knobs=knobs)
    for key, value in {**knobs.set_knobs(), **unhonoured}.items():  # a knob's value is part of the id, a path
        if isinstance(value, str):
            check_name(f"backend.{key}", value)
    # a knob the backend does not honour is part of what was asked: its case is skipped under an id of its own
    asked = {**knobs.values(), **unhonoured}
    ident = ident_mod.identity(config, asked, shape_name, shape)
    variant = variant_of_knobs({**knobs.set_knobs(), **unhonoured})
    cid = ident_mod.case_id(ident, variant)
    check_name("shape", shape_name)
    twin = cid if recipe.format is Format.BF16 else _twin_id(config, shape_name, asked, variant)
    point = ident_mod.identity(twin_config(config), asked, "", {})
    group = ident_mod.prefix(point, variant) + "~" + ident_mod.digest({k: v for k, v in point.items() if k != "shape"})
    return Case(config=config, shape_name=shape_name, shape=shape, recipe=recipe, unhonoured=unhonoured,
                identity=ident, case_id=cid, label=ident_mod.prefix(ident, variant), twin_id=twin, group=group)


def twin_config(config: Config) -> Config:
    """The BF16 point a recipe's point divides by: the same point in BF16, with no scales, and BF16 gathers
    where the recipe all-gathers FP8 weights."""
    workload = config.workload
    if workload.train.fp8_all_gather:
        workload = dataclasses.replace(workload, train=dataclasses.replace(workload.train, fp8_all_gather=False))
    return dataclasses.replace(config, format=FormatConfig(name="bf16"), scaling=ScalingConfig(name="none"),
                               workload=workload)


def twin_shape(config: Config, shape_name: str) -> tuple[str, dict] | None:
    """(name, shape) of the twin's shape matching a recipe's `shape_name`, None where the twin has none."""
    name = shape_name.removesuffix(FP8_ALL_GATHER_TAG)
    return next(((n, s) for n, s in shapes_module.shapes(twin_config(config)) if n == name), None)


def twin_case(case: Case) -> Case | None:
    """The BF16 case a recipe's speedup divides by, built from its point; None where the twin has no shape."""
    found = twin_shape(case.config, case.shape_name)
    return None if found is None else build(twin_config(case.config), *found)


def _twin_id(config: Config, shape_name: str, knobs: dict, variant: str) -> str:
    found = twin_shape(config, shape_name)
    if found is None:
        return ""
    name, shape = found
    return ident_mod.case_id(ident_mod.identity(twin_config(config), knobs, name, shape), variant)


def cases_of(config: Config) -> list[Case]:
    """Every case of one point (one per shape)."""
    return [build(config, name, shape) for name, shape in shapes_module.shapes(config)]
