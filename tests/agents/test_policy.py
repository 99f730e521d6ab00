"""The SGLang client against the scripted SGLang-compatible server (real HTTP on loopback)."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from trio_swe.demo import (
    ScriptedCompletion,
    open_scripted_policy_server,
    scripted_logprob,
)
from trio_swe.policy import ByteTokenizer, PolicyError, SGLangPolicy

TOK = ByteTokenizer()
PROMPT = "Instance: inst-1\n<|im_start|>assistant\n"


def test_byte_tokenizer_round_trip() -> None:
    text = "héllo ```bash\nls\n```"
    ids = TOK.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert TOK.decode(ids) == text
    # A cut inside a multi-byte character decodes with a replacement, never raises.
    assert TOK.decode(ids[:2]).startswith("h")


async def test_generate_returns_scripted_ids_and_aligned_logprobs() -> None:
    async with (
        open_scripted_policy_server({"inst-1": ["first", "second"]}) as server,
        SGLangPolicy(server.url) as policy,
    ):
        out = await policy.generate(TOK.encode(PROMPT), {"max_new_tokens": 100}, session_id="s1")
        assert TOK.decode(out.output_ids) == "first<|im_end|>"
        assert out.finish_reason == "stop"
        assert out.log_probs == [scripted_logprob(t, i) for i, t in enumerate(out.output_ids)]
        # Turn 1: the prompt now holds two assistant headers.
        prompt2 = PROMPT + "first<|im_end|>\nobs\n<|im_start|>assistant\n"
        out2 = await policy.generate(TOK.encode(prompt2), {"max_new_tokens": 100})
        assert TOK.decode(out2.output_ids) == "second<|im_end|>"
        # max_new_tokens cuts the output and says so.
        out3 = await policy.generate(TOK.encode(PROMPT), {"max_new_tokens": 3})
        assert TOK.decode(out3.output_ids) == "fir"
        assert out3.finish_reason == "length"
        assert policy.statistics().requests == 3


async def test_cancelled_generation_is_aborted_on_the_server() -> None:
    async with (
        open_scripted_policy_server(
            {"inst-1": [ScriptedCompletion("slow", delay_sec=60)]}
        ) as server,
        SGLangPolicy(server.url) as policy,
    ):
        with trio.CancelScope() as scope:

            async def cancel_once_generating() -> None:
                # Once the server generates (a fixed delay raced a loaded machine: cancelled
                # before the request arrived, the abort came first and the generation after).
                with trio.fail_after(60):  # a hang guard only
                    while not server.statistics().active:  # noqa: ASYNC110 (no event to wait on)
                        await trio.sleep(0.01)
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_once_generating)
                await policy.generate(TOK.encode(PROMPT), {})
        assert scope.cancelled_caught
        assert len(server.aborted_rids) == 1
        assert policy.statistics().aborts == 1
        # The server's pending generation was cancelled by the abort, not left sleeping.
        await trio.testing.wait_all_tasks_blocked()
        assert server.statistics().active == 0


async def test_http_errors_become_policy_error() -> None:
    async with (
        open_scripted_policy_server({}) as server,
        SGLangPolicy(server.url + "/nowhere") as policy,
    ):
        with pytest.raises(PolicyError, match="HTTP 404"):
            await policy.generate([1, 2], {})
    # The server is gone now: connection refused is a PolicyError too.
    async with SGLangPolicy(server.url, client=httpx.AsyncClient()) as policy:
        with pytest.raises(PolicyError):
            await policy.generate([1, 2], {})


def test_reply_decoding_null_log_probs_old_servers_and_bad_replies() -> None:
    import math

    import msgspec

    from trio_swe.policy._sglang import decode_generate_reply

    def body(**fields: object) -> bytes:
        meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": fields.pop("e")}
        return msgspec.json.encode({"text": "ab", "meta_info": meta, **fields})

    entries = [[-0.5, 7, None], [None, 8, "b"], [0, 9, None]]
    out = decode_generate_reply(body(e=entries, output_ids=[7, 8, 9]))
    assert out.output_ids == [7, 8, 9]
    assert out.log_probs[0] == -0.5
    assert math.isnan(out.log_probs[1])
    assert out.log_probs[2] == 0.0
    assert out.finish_reason == "length"
    # A server that sends no top-level output_ids: the ids come from the entries.
    assert decode_generate_reply(body(e=entries)).output_ids == [7, 8, 9]
    with pytest.raises(PolicyError, match="2 output_ids but 3"):
        decode_generate_reply(body(e=entries, output_ids=[7, 8]))
    with pytest.raises(PolicyError, match="malformed"):
        decode_generate_reply(body(e=[["x", 7, None]], output_ids=[7]))
    with pytest.raises(PolicyError, match="malformed"):
        decode_generate_reply(b"{")
