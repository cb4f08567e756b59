"""Hypothesis strategies for frame bodies, derived from the msgspec Structs themselves: a new
field or a new body type is fuzzed without touching the tests."""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

__all__ = ["encode_any", "field_names", "msgpack_values", "values_of"]

# Every integer msgpack can carry: int64 down, uint64 up.
INTS = st.integers(-(2**63), 2**64 - 1)
# Small containers: the decoder's work per element is what is tested, not the element count.
SIZE_MAX = 4


def _of(t: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(t, mi.StrType):
        return st.text(max_size=40)
    if isinstance(t, mi.IntType):
        return INTS
    if isinstance(t, mi.FloatType):
        return st.floats(allow_nan=False)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=64)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.UnionType):
        return st.one_of(*(_of(u) for u in t.types))
    if isinstance(t, mi.ListType):
        return st.lists(_of(t.item_type), max_size=SIZE_MAX)
    if isinstance(t, mi.DictType):
        return st.dictionaries(_of(t.key_type), _of(t.value_type), max_size=SIZE_MAX)
    if isinstance(t, mi.TupleType):
        return st.tuples(*(_of(item) for item in t.item_types))
    if isinstance(t, mi.StructType):
        fields = {f.name: _of(f.type) for f in t.fields}
        return st.builds(t.cls, **fields)
    raise AssertionError(f"no strategy for {t!r}: add one for the new field type")


def values_of(body_type: object) -> st.SearchStrategy[Any]:
    """Valid values of a body type (a Struct, or a list of one), every field filled."""
    return _of(mi.type_info(body_type))


def msgpack_values(names: tuple[str, ...] = ()) -> st.SearchStrategy[Any]:
    """Any msgpack value, nested; maps are keyed by ``names`` (a body's field names) as often
    as by other strings, so values of the wrong type reach the fields' checks."""
    scalars = st.one_of(
        st.none(), st.booleans(), INTS, st.floats(), st.text(max_size=20), st.binary(max_size=20)
    )
    keys = st.sampled_from(names) | st.text(max_size=8) if names else st.text(max_size=8)
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=SIZE_MAX) | st.dictionaries(keys, inner, max_size=SIZE_MAX)
        ),
        max_leaves=12,
    )


def field_names(body_type: object) -> tuple[str, ...]:
    info = mi.type_info(body_type)
    if isinstance(info, mi.ListType):
        info = info.item_type
    return tuple(f.name for f in info.fields) if isinstance(info, mi.StructType) else ()


def encode_any(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)
