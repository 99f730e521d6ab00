"""The results file: round trip, resume after a torn write."""

from __future__ import annotations

from pathlib import Path

from trio_swe import EpisodeResult
from trio_swe.results import ResultsWriter, encode_result, read_results


def _result(iid: str, status: str = "completed", reward: float = 1.0) -> EpisodeResult:
    from trio_swe import Sample

    sample = Sample.from_lists(
        tokens=[1, 2, 3, 4, 5],
        loss_mask=[0, 1, 1],
        rollout_log_probs=[0.0, -0.5, -0.25],
        response_length=3,
        reward=reward,
    )
    return EpisodeResult(
        instance_id=iid,
        episode_id=f"{iid}#1",
        protocol="scaleswe",
        status=status,  # type: ignore[arg-type]
        reward=reward,
        samples=[sample],
        patch=b"diff --git a/x b/x\n",
    )


def test_results_file_round_trip_and_resume_after_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "results.msgpack"
    with ResultsWriter(path) as writer:
        assert writer.previous == []
        for i in range(3):
            writer.write(_result(f"i{i}"))
    # A writer killed mid-frame leaves a torn frame at the end.
    torn = encode_result(_result("torn"))
    with open(path, "ab") as f:
        f.write(torn[: len(torn) // 2])
    results, intact = read_results(path)
    assert [r.instance_id for r in results] == ["i0", "i1", "i2"]
    assert intact < path.stat().st_size
    with ResultsWriter(path) as writer:
        assert [r.instance_id for r in writer.previous] == ["i0", "i1", "i2"]
        writer.write(_result("i3", status="aborted", reward=0.0))
    results, intact = read_results(path)
    assert intact == path.stat().st_size
    assert [r.instance_id for r in results] == ["i0", "i1", "i2", "i3"]
    assert results[0].samples == _result("i0").samples
    assert results[0].samples[0].rollout_log_probs_list() == [0.0, -0.5, -0.25]
    assert results[3].status == "aborted"
    assert read_results(tmp_path / "missing.msgpack") == ([], 0)
