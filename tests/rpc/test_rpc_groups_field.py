"""groups_field (metricsd/rpc/wire.py) encodes exactly what filling Group messages would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import groups_field, labels_to_pb

text = st.text(max_size=12)
label_sets = st.lists(st.lists(st.tuples(text, text), max_size=4).map(lambda ls: tuple(sorted(set(ls)))), max_size=20)


@given(label_sets)
def test_the_bytes_are_those_of_the_messages(groups: list[tuple[tuple[str, str], ...]]) -> None:
    fast = pb.AggregateResponse()
    fast.MergeFromString(groups_field(2, groups))
    slow = pb.AggregateResponse()
    for g in groups:
        slow.groups.add().labels.extend(labels_to_pb(g))
    assert fast == slow
    assert fast.SerializeToString() == slow.SerializeToString()
