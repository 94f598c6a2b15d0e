"""Put times, expiries and log indexes held as 4-byte offsets (statemachine/columns.py): a column
reads, counts and snapshots the values it was given, whatever they are, and holds 4 bytes a value
while they lie close together."""

from hypothesis import given, settings
from hypothesis import strategies as st

from statemachine.columns import OffsetColumn, runs_of

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


def check(column: OffsetColumn, model: list) -> None:
    assert len(column) == len(model)
    assert [column[row] for row in range(len(model))] == model
    assert column.zeros() == model.count(0)
    assert column.nonzero() == [(row, value) for row, value in enumerate(model) if value]
    for start in {0, len(model) // 2, len(model)}:
        assert column.runs(start) == runs_of(model[start:])
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
