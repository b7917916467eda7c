"""The case model: a frozen, typed case built once from a resolved point and one of its shapes, its identity
(everything that can change what it measures) and the id derived from it."""

from fp8bench.cases.case import Case, build, cases_of, twin_case, twin_config, twin_shape
from fp8bench.cases.identity import identity

__all__ = ["Case", "build", "cases_of", "identity", "twin_case", "twin_config", "twin_shape"]
