"""Run one schedule against a *tree* of agents (DESIGN §17): one watched script per
agent, ``Op.target`` for the run an operation acts on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import Agent, Item, Model
from ..models import ScriptedModel, Turn
from ..sessions import Session
from ._fakes import ToolRecorder
from ._faults import Faults, WatchedModel
from ._observation import Observation
from ._runner import run_example
from ._strategies import Op
from ._tree import TreeSetup

__all__ = ["run_tree_schedule"]


def run_tree_schedule(
    tree: Callable[[Mapping[str, Model]], Agent],
    scripts: Mapping[str, Sequence[Turn | str]],
    schedule: Sequence[Op] = (),
    *,
    faults: Mapping[str, Faults] | None = None,
    recorder: ToolRecorder | None = None,
    input: str | Item | Sequence[Item] = "go",
    run_options: Mapping[str, Any] | None = None,
    default_turn: Turn | str | None = "the end",
    horizon: float = 100_000.0,
    check_processes: bool | None = None,
    session: bool | Callable[[], Session] = False,
    thread_hold: float | None = 1.0,
    thread_grace: float = 5.0,
) -> Observation:
    """Run one example of a *tree* of agents (DESIGN §17) and return what happened.

    ``scripts`` gives each agent (by name) its script: the harness makes one watched
    :class:`ScriptedModel` per agent (every run of that agent plays from it, in call
    order, then ``default_turn``) and calls ``tree(models)`` (agent name → model) to
    build the root agent — typically an agent whose tools include other agents'
    :meth:`~trio_agents.Agent.as_tool`. The root agent's name must be a key of
    ``scripts``.

    ``faults`` gives each agent's :class:`Faults`: its model faults (counted over all
    the calls of its model) and hook faults (counted per run; every run of the tree
    shares the root's hooks, split per run by the harness); the session fault is the
    root's. An :class:`Op` with a ``target`` acts on the first live run of that
    agent. Everything else is as in :func:`run_schedule`; the absent user also
    approves every call waiting below the root. The :class:`Observation` is the
    root's, with :attr:`Observation.tree` holding every run of the tree;
    :func:`~trio_agents.testing.check_run` checks the tree invariants as well.
    """
    per_agent = dict(faults or {})
    models = {
        name: WatchedModel(
            ScriptedModel(list(script), default=default_turn),
            per_agent.get(name, Faults()).model,
        )
        for name, script in scripts.items()
    }
    agent = tree(dict(models))
    if agent.name not in models:
        raise ValueError(
            f"the root agent {agent.name!r} has no script (scripts are given for {sorted(models)})"
        )
    root_faults = per_agent.get(agent.name, Faults())
    setup = TreeSetup(
        models=models,
        hook_faults={name: f.hooks for name, f in per_agent.items() if f.hooks},
    )
    return run_example(
        agent,
        models[agent.name],
        setup,
        schedule,
        recorder=recorder,
        input=input,
        run_options=run_options,
        horizon=horizon,
        check_processes=check_processes,
        faults=root_faults,
        session=session,
        thread_hold=thread_hold,
        thread_grace=thread_grace,
    )
