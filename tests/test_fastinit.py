"""pybk.wire.fastinit: the wire types built by the quicker __init__ are the same objects."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from pybk import wire
from pybk.wire.fastinit import fast_init

TYPES = [getattr(wire, n) for n in dir(wire)
         if n.endswith(("Request", "Response")) and dataclasses.is_dataclass(getattr(wire, n))]


def test_every_wire_type_has_its_fields_as_parameters_with_their_defaults():
    assert len(TYPES) == 22
    for cls in TYPES:
        params = list(inspect.signature(cls).parameters.values())
        fields = dataclasses.fields(cls)
        assert [p.name for p in params] == [f.name for f in fields], cls
        for p, f in zip(params, fields, strict=True):
            want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
            assert p.default == want, (cls, f.name)


def test_built_by_position_and_keyword_alike_equal_hashable_frozen_picklable():
    a = wire.AddBatchRequest(7, b"k", [1, 2], [b"a", b"b"], True)
    b = wire.AddBatchRequest(ledger_id=7, master_key=b"k", entry_ids=[1, 2],
                             bodies=[b"a", b"b"], recovery=True, deferred_sync=False)
    assert a == b and a.deferred_sync is False
    r = wire.ReadRequest(3, 4, master_key=b"m")
    assert r == wire.ReadRequest(3, 4, False, b"m", None, 0.0)
    assert hash(r) == hash(wire.ReadRequest(3, 4, False, b"m"))
    assert pickle.loads(pickle.dumps(r)) == r
    assert dataclasses.replace(r, entry_id=5).entry_id == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.entry_id = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        wire.ReadRequest(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        wire.ReadRequest(1, 2, bogus=3)  # type: ignore[call-arg]


def test_refuses_classes_it_cannot_serve():
    class Plain:
        pass

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        x: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Post:
        x: int

        def __post_init__(self) -> None:
            pass

    for cls in (Plain, NoSlots, Factory, Post):
        with pytest.raises(ValueError):
            fast_init(cls)
