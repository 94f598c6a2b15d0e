"""Put times, expiries and log indexes held as 4-byte offsets (statemachine/columns.py): a column
reads, counts and snapshots the values it was given, whatever they are, and holds 4 bytes a value
while they lie close together."""

from array import array
from itertools import groupby

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from raftq.statemachine.columns import ALL_EQUAL_STEP, ENCODE_STEP, LittleEndian, OffsetColumn, encode_column, from_little_endian, runs_of

NOW = 1_795_000_000_000          # a put time: milliseconds since 1970
DAY = 86_400_000

near = st.integers(NOW - 3 * DAY, NOW + 3 * DAY)
anywhere = st.one_of(st.just(0), near, st.integers(1, 1 << 62))
operations = st.lists(st.one_of(
    st.tuples(st.just("append"), st.one_of(st.just(0), near, near, near, anywhere)),
    st.tuples(st.just("set"), st.integers(0, 10_000), st.one_of(st.just(0), near, anywhere)),
    st.tuples(st.just("cut"), st.integers(0, 10_000)),
    st.tuples(st.just("runs"), st.lists(st.tuples(anywhere, st.integers(1, 5)), max_size=3)),
), max_size=60)


def model_runs(values: list) -> list:
    runs = [(value, len(list(run))) for value, run in groupby(values)]
    return [[value for value, _ in runs], [length for _, length in runs]]


def check(column: OffsetColumn, model: list) -> None:
    assert len(column) == len(model)
    assert [column[row] for row in range(len(model))] == model
    assert column.zeros() == model.count(0)
    assert column.nonzero() == [(row, value) for row, value in enumerate(model) if value]
    for start in {0, len(model) // 2, len(model)}:
        assert column.runs(start) == model_runs(model[start:])
        assert column.distinct(start) == set(model[start:])
        assert column.zeros(start) == model[start:].count(0)
    restored = OffsetColumn()
    restored.extend_runs(column.runs())
    assert [restored[row] for row in range(len(model))] == model


@settings(max_examples=300, deadline=None)
@given(operations)
def test_a_column_holds_the_values_it_was_given(steps):
    column, model = OffsetColumn(), []
    for step in steps:
        if step[0] == "append":
            column.append(step[1])
            model.append(step[1])
        elif step[0] == "set" and model:
            row = step[1] % len(model)
            column[row] = step[2]
            model[row] = step[2]
        elif step[0] == "cut" and model:
            cut = step[1] % (len(model) + 1)
            del column[:cut]
            del model[:cut]
        elif step[0] == "runs":
            runs = [[value for value, _ in step[1]], [length for _, length in step[1]]]
            column.extend_runs(runs)
            model.extend(value for value, length in step[1] for _ in range(length))
        check(column, model)


def test_values_weeks_apart_take_four_bytes_each_and_a_far_one_widens_the_column_until_it_empties():
    column = OffsetColumn()
    for value in (NOW, 0, NOW + 20 * DAY, NOW - 20 * DAY, NOW):
        column.append(value)
    assert column.held.itemsize == 4
    column.append(NOW + 30 * DAY)
    assert column.held.itemsize == 8
    assert [column[row] for row in range(6)] == [NOW, 0, NOW + 20 * DAY, NOW - 20 * DAY, NOW, NOW + 30 * DAY]
    del column[:]
    column.append(NOW + 30 * DAY)
    assert column.held.itemsize == 4 and column[0] == NOW + 30 * DAY


def test_a_value_whose_offset_would_be_the_zero_marker_reads_back_as_itself():
    for value in (NOW - (1 << 31), NOW + (1 << 31)):
        column = OffsetColumn()
        column.append(NOW)
        column.append(value)
        column[0] = value
        assert (column[0], column[1]) == (value, value) and column.zeros() == 0


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["I", "B"]), st.lists(st.tuples(st.integers(0, 255), st.integers(1, 4)), max_size=20),
       st.integers(0, 100))
def test_runs_of_a_column_from_a_row_on(typecode, runs, start):
    values = [value for value, length in runs for _ in range(length)]
    column = array(typecode, values) if typecode == "I" else bytearray(values)
    assert runs_of(column, start) == model_runs(values[start:])
    column.append(1)            # no view of it outlives the call: it can still grow


def test_runs_longer_than_one_comparison_are_found_whole():
    long = 3 * ALL_EQUAL_STEP + 5
    column = array("I", [7] * long + [8] + [7] * long)
    assert runs_of(column) == [[7, 8, 7], [long, 1, long]]
    assert runs_of(column, long + 1) == [[7], [long]]
    assert runs_of(column, len(column)) == [[], []]


def test_a_little_endian_column_is_encoded_from_the_column_and_read_back():
    values = [1, 2, 0xFFFFFFFF, 4, *range(ENCODE_STEP // 2)]      # twice what the encoder is handed at once
    column = array("I", values)
    encoded = cbor2.dumps([LittleEndian(column, 1), "after"], default=encode_column)
    data, after = cbor2.loads(encoded)
    assert after == "after"
    assert data == b"".join(value.to_bytes(4, "little") for value in values[1:])
    restored = array("I")
    from_little_endian(restored, data)
    assert list(restored) == values[1:]
    column.append(5)            # released once encoded
