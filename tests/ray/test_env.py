"""SWE_RAY_* for slime's shared pool: parsed when asked for, bad values named."""

from __future__ import annotations

import pytest

from trio_swe import ConfigError
from trio_swe.ray import RayOptions


def test_unset_or_zero_means_no_ray() -> None:
    assert RayOptions.from_env({}) is None
    assert RayOptions.from_env({"SWE_RAY_WORKERS": " 0 "}) is None


def test_the_variables_are_read() -> None:
    options = RayOptions.from_env(
        {
            "SWE_RAY_WORKERS": "3",
            "SWE_RAY_CONCURRENCY": "8",
            "SWE_RAY_ADDRESS": "10.0.0.1:6379",
            "SWE_RAY_POOL": "swe-pool",
            "SWE_RAY_MAX_ALIVE": "20",
            "SWE_RAY_DETACHED": "1",
        }
    )
    assert options == RayOptions(
        workers=3,
        concurrency=8,
        address="10.0.0.1:6379",
        pool="swe-pool",
        max_alive=20,
        detached=True,
    )
    auto = RayOptions.from_env({"SWE_RAY_WORKERS": "auto"})
    assert auto is not None
    assert auto.workers is None  # one per node
    assert auto.address == "auto"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SWE_RAY_WORKERS": "two"}, "SWE_RAY_WORKERS='two'"),
        ({"SWE_RAY_WORKERS": "-1"}, "SWE_RAY_WORKERS='-1'"),
        ({"SWE_RAY_WORKERS": "2", "SWE_RAY_CONCURRENCY": "0"}, "SWE_RAY_CONCURRENCY='0'"),
        ({"SWE_RAY_WORKERS": "2", "SWE_RAY_MAX_ALIVE": "1.5"}, "SWE_RAY_MAX_ALIVE='1.5'"),
        ({"SWE_RAY_WORKERS": "2", "SWE_RAY_POOL": "a pool"}, "SWE_RAY_POOL='a pool'"),
        ({"SWE_RAY_WORKERS": "2", "SWE_RAY_DETACHED": "maybe"}, "SWE_RAY_DETACHED='maybe'"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RayOptions.from_env(env)
