import pytest

from corescale.errors import UserError
from corescale.machine.cpulist import format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    "text, cpus",
    [
        ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
        ("0", (0,)),
        ("", ()),
        ("  \n", ()),
        ("0-95\n", tuple(range(96))),
        (" 8, 0-2 ,1 ", (0, 1, 2, 8)),  # unsorted, overlapping, spaces
        ("3,3,3", (3,)),
        ("5-5", (5,)),
    ],
)
def test_parse(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-a", "a", "1,,2", "0-3,", "-1", "1-2-3", "1 2", "0x3", "1.5"])
def test_parse_rejects_bad_text(text):
    with pytest.raises(UserError) as e:
        parse_cpulist(text)
    assert f"invalid CPU list '{text.strip()}'" in str(e.value)
    assert "0-3,8" in str(e.value)  # shows the expected form


def test_parse_rejects_reversed_and_huge_ranges():
    with pytest.raises(UserError, match="range 5-3 is reversed"):
        parse_cpulist("5-3")
    with pytest.raises(UserError, match="above 65535"):
        parse_cpulist("0-999999999")


@pytest.mark.parametrize(
    "cpus, text",
    [
        ((0, 1, 2, 3, 8), "0-3,8"),
        ((), ""),
        ((7,), "7"),
        ((0, 1), "0-1"),
        ((11, 10, 0, 2, 1, 1), "0-2,10-11"),
        (range(0, 96, 2), ",".join(str(i) for i in range(0, 96, 2))),
    ],
)
def test_format(cpus, text):
    assert format_cpulist(cpus) == text


def test_format_rejects_negative():
    with pytest.raises(ValueError):
        format_cpulist([-1, 0])


@pytest.mark.parametrize("cpus", [(0,), (0, 1, 2, 3, 8, 10, 11), tuple(range(0, 96, 3)), (3, 5, 7, 8, 9)])
def test_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == cpus
