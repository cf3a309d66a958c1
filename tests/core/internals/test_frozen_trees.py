"""The read-only JSON trees every run shares (trio_agents/_frozen.py)."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from trio_agents._frozen import FrozenDict, FrozenList, freeze_json, thaw_json

TREE = {"type": "object", "items": [1, {"a": (2, 3)}], "x": None, "f": 1.5}


def test_freeze_copies_and_refuses_every_change() -> None:
    source: Any = copy.deepcopy(TREE)
    frozen: Any = freeze_json(source)
    assert frozen == {"type": "object", "items": [1, {"a": [2, 3]}], "x": None, "f": 1.5}
    assert type(frozen) is FrozenDict
    assert type(frozen["items"]) is FrozenList
    assert type(frozen["items"][1]["a"]) is FrozenList
    source["items"][1]["a"] = "changed"  # the source stays its owner's
    assert frozen["items"][1]["a"] == [2, 3]
    d, lst = frozen, frozen["items"]
    changes: list[Callable[[], object]] = [
        lambda: d.__setitem__("k", 1),
        lambda: d.__delitem__("type"),
        lambda: d.__ior__({"k": 1}),
        lambda: d.clear(),
        lambda: d.pop("type"),
        lambda: d.popitem(),
        lambda: d.setdefault("k", 1),
        lambda: d.update(k=1),
        lambda: lst.__setitem__(0, 2),
        lambda: lst.__delitem__(0),
        lambda: lst.__iadd__([1]),
        lambda: lst.__imul__(2),
        lambda: lst.append(1),
        lambda: lst.extend([1]),
        lambda: lst.insert(0, 1),
        lambda: lst.pop(),
        lambda: lst.remove(1),
        lambda: lst.clear(),
        lambda: lst.sort(),
        lambda: lst.reverse(),
        # Through the object, not only its mutators (issue 29): a second __init__
        # (the inherited one updated in place), and a class switch to plain dict/list.
        lambda: type(d).__init__(d, {"k": 1}),
        lambda: type(d).__init__(d, k=1),
        lambda: type(lst).__init__(lst, []),
        lambda: type(lst).__init__(lst, [9, 9]),
        lambda: setattr(d, "__class__", dict),
        lambda: setattr(lst, "__class__", list),
        lambda: delattr(d, "__class__"),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert frozen == freeze_json(TREE)


def test_frozen_trees_are_json_and_copy_to_plain_ones() -> None:
    frozen = freeze_json(TREE)
    assert freeze_json(frozen) is frozen  # frozen once
    assert json.loads(json.dumps(frozen, sort_keys=True)) == thaw_json(TREE)
    deep = copy.deepcopy(frozen)
    assert type(deep) is dict
    assert type(deep["items"]) is list
    assert type(deep["items"][1]) is dict
    deep["items"][1]["a"].append(4)
    assert type(copy.copy(frozen)) is dict
    assert type(dict(frozen)) is dict
    assert type(frozen | {}) is dict
    assert type(frozen["items"] + []) is list
    loaded = pickle.loads(pickle.dumps(frozen))
    assert type(loaded) is FrozenDict
    assert loaded == frozen
