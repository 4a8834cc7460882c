"""Operator-by-operator comparison of two dumps: ``compare(A, B)``, A under test, B the
reference (``max_rel_err`` is relative to B). Two devices, precisions, compilers, eager
against compiled, frameworks, or a MindSpore dump against an opdump dump.

The stages, one module each (as Polygraphy's comparator separates them):

* :mod:`.pairs` -- the records: ``Tensor``, ``OpCall``, ``Pair``, the table's columns;
* :mod:`.match` -- pluggable matchers: the user's mapping (:mod:`.mapping`), the two
  execution orders aligned per scope on operator type and tensor signature, the full name;
* :mod:`.verdict` -- metrics (:mod:`opdump.analysis.metrics`) -> verdicts, and whether a
  same-dtype pair is identical;
* :mod:`.first` -- the first difference (same dtypes) and the first divergence (thresholds);
* :mod:`.pool` -- tensor metrics in worker processes with bounded memory;
* :mod:`.run` -- ``compare()`` running the stages; :mod:`.result` -- ``CompareResult``.

README, "Analysis" > compare, documents the rules, metrics and verdicts for users.
"""
from .mapping import load_mapping
from .match import AlignedOrderMatcher, MappingMatcher, Matcher, NameMatcher, UniqueSignatureMatcher, default_matchers
from .pairs import TABLE_COLUMNS, Pair, Tensor
from .result import RULE_FIRST_DIFFERENCE, RULE_THRESHOLDS, CompareResult
from .run import CompareError, compare
from .verdict import Thresholds, verdict_for_metrics

__all__ = ["Thresholds", "CompareResult", "CompareError", "compare", "load_mapping", "verdict_for_metrics",
           "Pair", "Tensor", "Matcher", "MappingMatcher", "AlignedOrderMatcher", "NameMatcher", "UniqueSignatureMatcher",
           "default_matchers", "TABLE_COLUMNS", "RULE_FIRST_DIFFERENCE", "RULE_THRESHOLDS"]
