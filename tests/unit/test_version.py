import pytest

from supervisor.policy.version import RangeError, compatibility, satisfies


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.1.0", ">=0.1", True),
        ("0.1.0", ">=0.2", False),
        ("1.4.2", ">=1.0,<2.0", True),
        ("2.0.0", ">=1.0,<2.0", False),
        ("1.4.2", "~=1.4", True),
        ("1.5.0", "~=1.4.0", False),
        ("1.9.0", "^1.2", True),
        ("2.0.0", "^1.2", False),
        ("0.2.5", "^0.2.1", True),
        ("0.3.0", "^0.2.1", False),
        ("3.1", "*", True),
        ("3.1", "", True),
        ("1.0.0", "==1", True),
        ("1.0.1", "!=1.0.1", False),
        ("1.0.0rc1", ">=1.0", True),
    ],
)
def test_satisfies(version, spec, ok):
    assert satisfies(version, spec) is ok


def test_bad_range():
    with pytest.raises(RangeError):
        satisfies("1.0", ">=banana")
    assert compatibility("1.0", ">=banana")[0] == "unknown"
    assert compatibility("1.0", None) == ("unknown", "")
    state, msg = compatibility("0.1.0", ">=2")
    assert state == "incompatible" and "0.1.0" in msg
