"""Why a test's FX graph missed: per-lookup components, their diff in words, and tests that can never hit.

torch computes every FX-graph cache key from named components and hands them to
``FxGraphCache.load_with_key`` as ``debug_lines``, one per component:
``[<hash>] <attr>[<index>]: <readable value>`` (the graph module's code, each example input's tensor
metadata, the compile kwargs, every inductor config option, torch version, system info...). ``probe``
captures them per lookup; this module, pure and torch-free, turns them into a compact
:class:`GraphLookup`, compares a missed lookup with the most similar graph the same test looked up
in an earlier run, and says what differs in words a user can act on.

Everything here round-trips through bounded JSON: lookups travel from xdist workers on test reports,
into a bundle's manifest (``graphs``) and into ``<cache dir>/.compilecache-graphs.json``.
The package, by concept: :mod:`.lookup` (one lookup, parsed from torch's lines), :mod:`.compare` (a miss against
the most similar earlier lookup, in words), :mod:`.history` (the record kept for the next run, and the streaks
that say a test can never hit), :mod:`.session` (a whole session, and the entry points that never raise).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from .compare import CONSTANT as CONSTANT
from .compare import GUARD_MISS as GUARD_MISS
from .compare import NEW_GRAPH as NEW_GRAPH
from .compare import NEW_TEST as NEW_TEST
from .compare import SAME_KEY as SAME_KEY
from .compare import MissExplanation as MissExplanation
from .compare import comparable as comparable
from .compare import constant_statements as constant_statements
from .compare import constant_what as constant_what
from .compare import diff as diff
from .compare import explain_miss as explain_miss
from .compare import explain_test as explain_test
from .compare import merged as merged
from .compare import most_similar as most_similar
from .compare import similarity as similarity
from .compare import symbolic_one_side as symbolic_one_side
from .history import NEVER_HIT_CHANGES as NEVER_HIT_CHANGES
from .history import NO_STREAK as NO_STREAK
from .history import SEEN_VALUES as SEEN_VALUES
from .history import GraphsRecord as GraphsRecord
from .history import Streak as Streak
from .history import carry_forward as carry_forward
from .history import constant_change as constant_change
from .history import install_restored as install_restored
from .history import load_record as load_record
from .history import never_hits as never_hits
from .history import save_record as save_record
from .lookup import CODE as CODE
from .lookup import CODE_TEXT_CHARS as CODE_TEXT_CHARS
from .lookup import CONFIG_GROUPS as CONFIG_GROUPS
from .lookup import CONFIG_OPTION as CONFIG_OPTION
from .lookup import FORMAT as FORMAT
from .lookup import GUARD as GUARD
from .lookup import HASH_CHARS as HASH_CHARS
from .lookup import INPUT as INPUT
from .lookup import MAX_COMPONENTS as MAX_COMPONENTS
from .lookup import MAX_GRAPH_LINES as MAX_GRAPH_LINES
from .lookup import MAX_LOOKUPS_PER_TEST as MAX_LOOKUPS_PER_TEST
from .lookup import MAX_REASONS as MAX_REASONS
from .lookup import MAX_RECORD_BYTES as MAX_RECORD_BYTES
from .lookup import OUTCOMES as OUTCOMES
from .lookup import RECORD_NAME as RECORD_NAME
from .lookup import STATEMENT_CHARS as STATEMENT_CHARS
from .lookup import VALUE_CHARS as VALUE_CHARS
from .lookup import VALUES_PER_LOOKUP as VALUES_PER_LOOKUP
from .lookup import Code as Code
from .lookup import GraphLookup as GraphLookup
from .lookup import lookup_from_torch as lookup_from_torch
from .session import CAME_BACK as CAME_BACK
from .session import SessionExplanation as SessionExplanation
from .session import changed_by as changed_by
from .session import earlier_graphs as earlier_graphs
from .session import explain_session as explain_session
from .session import explain_session_safely as explain_session_safely
from .session import explain_test_safely as explain_test_safely
from .session import graphs_by_function as graphs_by_function
from .session import order_dependent_tests as order_dependent_tests
from .session import read_baseline as read_baseline
