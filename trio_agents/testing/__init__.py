"""A property-based lifecycle harness: fuzz an agent's runs and check every invariant.

Needs the ``testing`` extra (``pip install 'trio-agents[testing]'``: Hypothesis,
pytest and pytest-trio); importing this package without Hypothesis fails with a
message saying so. The pieces:

- :class:`ScriptedModel` / :class:`Turn`: a deterministic model that records requests.
- Fake tools that report what happened to them (:class:`ToolRecorder`):
  :func:`blocking_tool`, :func:`sleeping_tool`, :func:`failing_tool`,
  :func:`thread_tool`, :func:`process_tool`; and fault tools that misbehave on
  purpose: :func:`swallowing_tool`, :func:`stray_cancel_tool`, :func:`shielding_tool`,
  :func:`garbage_tool`, :func:`stubborn_thread_tool`; tools that return hostile text
  or raise an exception whose ``str()`` raises: :func:`hostile_text_tool`,
  :func:`broken_str_tool`.
- Faults of models, hooks and sessions: :class:`Faults` (:class:`ModelFault`,
  :class:`HookFault`, :class:`SessionFault`).
- Hypothesis strategies: :func:`tool_sets`, :func:`scripts`, :func:`schedules`
  (operations :class:`Op` at virtual times), :func:`items`, :func:`faults`, and
  :func:`hostile_texts` / :func:`hostile_items` (lone surrogates, NUL, huge text).
- :func:`run_schedule`: one example on ``MockClock(autojump_threshold=0)``, returning an
  :class:`Observation`; :func:`check_run`: the invariant checker, returning a
  :class:`Report`.
- Run trees (DESIGN §17): :func:`run_tree_schedule` plays one script per agent of a
  tree of agents, with :class:`Op` targets (``Op.target``: the agent whose first
  live run an operation acts on); :func:`agent_trees` draws small trees
  (:class:`AgentTree`); :func:`check_run` then checks the tree invariants too
  (:class:`TreeObservation`), and :func:`check_tree` checks a tree you drove
  yourself from its root's handle.
- :class:`LifecycleProperty` and :func:`lifecycle_test`: the property for an agent;
  ``pytest -p trio_agents.testing.plugin`` adds the ``scripted_model`` and
  ``lifecycle_check`` fixtures. :func:`harness_settings`: the Hypothesis settings
  they use (no deadline, no ``too_slow``).

- Evals (``docs/evals.md``): :func:`eval_params` makes one pytest test per case of a
  dataset, each an :class:`EvalCase` whose ``check(agents)`` runs it (the evals extra).

See ``docs/testing.md``.
"""

try:
    import hypothesis as _hypothesis
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trio_agents.testing needs Hypothesis: pip install 'trio-agents[testing]'"
    ) from exc

from ..models import ScriptedModel as ScriptedModel
from ..models import Turn as Turn
from ._checker import check_run as check_run
from ._event_checks import check_events as check_events
from ._fakes import GARBAGE as GARBAGE
from ._fakes import HOSTILE_TEXTS as HOSTILE_TEXTS
from ._fakes import BrokenStrError as BrokenStrError
from ._fakes import CallRecord as CallRecord
from ._fakes import FakeToolError as FakeToolError
from ._fakes import ToolRecorder as ToolRecorder
from ._fakes import blocking_tool as blocking_tool
from ._fakes import broken_str_tool as broken_str_tool
from ._fakes import failing_tool as failing_tool
from ._fakes import garbage_tool as garbage_tool
from ._fakes import hostile_text_tool as hostile_text_tool
from ._fakes import process_tool as process_tool
from ._fakes import shielding_tool as shielding_tool
from ._fakes import sleeping_tool as sleeping_tool
from ._fakes import stray_cancel_tool as stray_cancel_tool
from ._fakes import stubborn_thread_tool as stubborn_thread_tool
from ._fakes import swallowing_tool as swallowing_tool
from ._fakes import thread_tool as thread_tool
from ._faults import HOOK_NAMES as HOOK_NAMES
from ._faults import Faults as Faults
from ._faults import HookCall as HookCall
from ._faults import HookFault as HookFault
from ._faults import InjectedFault as InjectedFault
from ._faults import ModelFault as ModelFault
from ._faults import SessionCall as SessionCall
from ._faults import SessionFault as SessionFault
from ._faults import StreamRecord as StreamRecord
from ._invariants import INVARIANTS as INVARIANTS
from ._invariants import LifecycleViolation as LifecycleViolation
from ._invariants import Report as Report
from ._invariants import Violation as Violation
from ._observation import CancelRecord as CancelRecord
from ._observation import FreshRun as FreshRun
from ._observation import InjectionRecord as InjectionRecord
from ._observation import ModelView as ModelView
from ._observation import NodeRecord as NodeRecord
from ._observation import Observation as Observation
from ._observation import SubscriberView as SubscriberView
from ._observation import TreeObservation as TreeObservation
from ._property import Failure as Failure
from ._property import LifecycleProperty as LifecycleProperty
from ._property import harness_settings as harness_settings
from ._property import lifecycle_test as lifecycle_test
from ._runner import run_schedule as run_schedule
from ._strategies import OP_KINDS as OP_KINDS
from ._strategies import AgentTree as AgentTree
from ._strategies import FakeTools as FakeTools
from ._strategies import Op as Op
from ._strategies import OpKind as OpKind
from ._strategies import agent_trees as agent_trees
from ._strategies import faults as faults
from ._strategies import hostile_items as hostile_items
from ._strategies import hostile_texts as hostile_texts
from ._strategies import items as items
from ._strategies import schedules as schedules
from ._strategies import scripts as scripts
from ._strategies import standard_tools as standard_tools
from ._strategies import tool_sets as tool_sets
from ._tree_checks import check_tree as check_tree
from ._tree_runner import run_tree_schedule as run_tree_schedule

__all__ = [
    "GARBAGE",
    "HOOK_NAMES",
    "HOSTILE_TEXTS",
    "INVARIANTS",
    "OP_KINDS",
    "AgentTree",
    "BrokenStrError",
    "CallRecord",
    "CancelRecord",
    "EvalCase",
    "Failure",
    "FakeToolError",
    "FakeTools",
    "Faults",
    "FreshRun",
    "GuardrailCall",
    "GuardrailPlan",
    "HookCall",
    "HookFault",
    "InjectedFault",
    "InjectionRecord",
    "LifecycleProperty",
    "LifecycleViolation",
    "ModelFault",
    "ModelView",
    "NodeRecord",
    "Observation",
    "Op",
    "OpKind",
    "PolicyFaults",
    "PolicyObservation",
    "Report",
    "ScriptedModel",
    "SessionCall",
    "SessionFault",
    "StreamRecord",
    "SubscriberView",
    "ToolRecorder",
    "TreeObservation",
    "Turn",
    "Violation",
    "agent_trees",
    "blocking_tool",
    "broken_str_tool",
    "check_events",
    "check_policies",
    "check_run",
    "check_tree",
    "eval_params",
    "failing_tool",
    "faults",
    "garbage_tool",
    "guardrail_plans",
    "harness_settings",
    "hostile_items",
    "hostile_text_tool",
    "hostile_texts",
    "items",
    "lifecycle_test",
    "policy_faults",
    "process_tool",
    "run_policy_schedule",
    "run_schedule",
    "run_tree_schedule",
    "schedules",
    "scripts",
    "shielding_tool",
    "sleeping_tool",
    "standard_tools",
    "stray_cancel_tool",
    "stubborn_thread_tool",
    "swallowing_tool",
    "thread_tool",
    "tool_sets",
    "usage_limits",
]

# Evals (DESIGN §24): one pytest test per case of a dataset (needs the evals extra when used).
from ._evals import EvalCase as EvalCase
from ._evals import eval_params as eval_params

# Run policies (DESIGN §18): guardrail and limit faults, their runner and checker.
from ._policy_check import check_policies as check_policies
from ._policy_faults import GuardrailCall as GuardrailCall
from ._policy_faults import GuardrailPlan as GuardrailPlan
from ._policy_faults import PolicyFaults as PolicyFaults
from ._policy_runner import PolicyObservation as PolicyObservation
from ._policy_runner import run_policy_schedule as run_policy_schedule
from ._policy_strategies import guardrail_plans as guardrail_plans
from ._policy_strategies import policy_faults as policy_faults
from ._policy_strategies import usage_limits as usage_limits

del _hypothesis
